"""Every record type in one Avro schema: the union a typed archive entry holds.

An archive stores records of all types in one Avro object container file, whose single schema
therefore holds a union of the record schemas (`tailguard.archive.entries`). Two rules make
that union a schema any Avro implementation accepts and keep it stable across releases:

- **One definition per named type.** Record schemas are self-contained files, so a named type
  used by several of them (`PartitionRef`, `InputRange`, ...) is defined in each. In one schema a
  name may be defined once: the first use keeps the definition, later ones refer to it by full
  name. Two definitions that differ (docs aside) are an error, since no single schema could
  hold both.
- **Types are only appended.** The branches come in the order the record types were released:
  those of the first release, then each later release's new ones, then types not released yet;
  within one step by topic (events, findings, commands), then name. Released directories are
  frozen (`tests/unit/test_schemas.py`), so a branch keeps its position forever. Avro readers
  resolve union branches by name, not position, so this matters to tools that name branches by
  position, such as Spark's `member0`, `member1`, ... columns.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

from tailguard.codec.schemas import RecordSchema, current_schemas, released_schemas
from tailguard.model import records as r

_NAMED_KINDS = ("record", "enum", "fixed")


def _release_number(version: str) -> int:
    return int(version[1:]) if version[1:].isdigit() else 0


def union_order(
    current: Mapping[str, RecordSchema], released: Mapping[str, Mapping[str, RecordSchema]]
) -> list[str]:
    """Record names in union order (module docstring): by first release, then topic and name."""
    ordered: list[str] = []
    seen: set[str] = set()
    steps = [released[v] for v in sorted(released, key=_release_number)] + [current]
    for step in steps:
        added = [name for name in step if name not in seen]
        added.sort(key=lambda name: (r.TOPICS.index(step[name].record_type.TOPIC), name))
        ordered += added
        seen.update(added)
    return ordered


def record_union(schemas: Sequence[RecordSchema]) -> list[dict[str, Any] | str]:
    """The raw schemas (docs kept) as one Avro union, each named type defined once."""
    defined: dict[str, Any] = {}
    return [_define_once(copy.deepcopy(s.raw), "", defined) for s in schemas]


def _full_name(definition: dict[str, Any], namespace: str) -> str:
    name = str(definition["name"])
    if "." in name:
        return name
    own = definition.get("namespace", namespace)
    return f"{own}.{name}" if own else name


def _without_docs(avro_type: Any) -> Any:
    if isinstance(avro_type, dict):
        return {k: _without_docs(v) for k, v in avro_type.items() if k != "doc"}
    if isinstance(avro_type, list):
        return [_without_docs(v) for v in avro_type]
    return avro_type


def _define_once(avro_type: Any, namespace: str, defined: dict[str, Any]) -> Any:
    """`avro_type` with every named type already in `defined` replaced by its full name."""
    if isinstance(avro_type, list):
        return [_define_once(branch, namespace, defined) for branch in avro_type]
    if not isinstance(avro_type, dict):
        return avro_type
    kind = avro_type["type"]
    if kind in _NAMED_KINDS:
        full = _full_name(avro_type, namespace)
        if full in defined:
            if json.dumps(_without_docs(avro_type), sort_keys=True) != defined[full]:
                raise ValueError(
                    f"two record schemas define {full} differently: one schema can hold only "
                    "one definition of a name"
                )
            return full
        defined[full] = json.dumps(_without_docs(avro_type), sort_keys=True)
        if kind == "record":
            inner = full.rsplit(".", 1)[0] if "." in full else ""
            for f in avro_type["fields"]:
                f["type"] = _define_once(f["type"], inner, defined)
        return avro_type
    if kind == "array":
        avro_type["items"] = _define_once(avro_type["items"], namespace, defined)
    elif kind == "map":
        avro_type["values"] = _define_once(avro_type["values"], namespace, defined)
    return avro_type


def release_union(version: str | None = None) -> list[RecordSchema]:
    """The record schemas of a release (`"v3"`; None: the current ones) in union order."""
    if version is None:
        return current_union()
    released = released_schemas()
    if version not in released:
        raise KeyError(f"no released schemas {version!r}; releases: {sorted(released)}")
    older = {v: s for v, s in released.items() if _release_number(v) < _release_number(version)}
    schemas = released[version]
    return [schemas[name] for name in union_order(schemas, older)]


@functools.cache
def current_union() -> list[RecordSchema]:
    """The current record schemas in union order."""
    current = current_schemas()
    return [current[name] for name in union_order(current, released_schemas())]
