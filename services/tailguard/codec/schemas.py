"""The Avro contracts shipped with the package: current schemas and released versions.

The files live in `schemas/` at the repository root; `tailguard/schemas` links to it so that the
same files are package data in the wheel. They are found through `importlib.resources`, never
through the working directory.

Layout: `schemas/<events|findings|commands>/<RecordName>.avsc` for the current version and
`schemas/released/<version>/<same layout>` for every released version.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

from fastavro import parse_schema
from fastavro.schema import fingerprint, to_parsing_canonical_form

from tailguard.model.records import RECORD_TYPES_BY_NAME, Record

TOPIC_DIRS = ("events", "findings", "commands")
RELEASED_DIR = "released"


@dataclass(frozen=True, slots=True)
class RecordSchema:
    """One version of one record type's schema."""

    record_type: type[Record]
    # The JSON as written in the .avsc file (with docs): what a schema registry is given.
    raw: dict[str, Any]
    # fastavro's parsed form, self-contained (its named types are its own).
    parsed: dict[str, Any]
    canonical_form: str
    # CRC-64-AVRO of the canonical form, as the 8 little-endian bytes of single-object encoding.
    fingerprint: bytes

    @property
    def full_name(self) -> str:
        return str(self.parsed["name"])


def schema_root() -> Traversable:
    return resources.files("tailguard").joinpath("schemas")


def record_schema(raw: dict[str, Any], record_type: type[Record] | None = None) -> RecordSchema:
    """Parse one top-level record schema; its record name must be a tailguard record type (or
    `record_type`'s name, for a record kept off the three topics, such as `FleetBlock`)."""
    # A fresh named-types dict per schema: every top-level schema defines its own named types,
    # and two versions of one type must not meet in one namespace table.
    parsed = parse_schema(raw, named_schemas={})
    if not isinstance(parsed, dict):
        raise ValueError(f"not a record schema: {raw!r:.80}")
    short_name = str(parsed["name"]).rsplit(".", 1)[-1]
    if record_type is None or record_type.__name__ != short_name:
        record_type = RECORD_TYPES_BY_NAME.get(short_name)
    if parsed.get("type") != "record" or record_type is None:
        raise ValueError(f"schema {parsed.get('name')!r} is not a tailguard record type")
    canonical = to_parsing_canonical_form(parsed)
    return RecordSchema(
        record_type=record_type,
        raw=raw,
        parsed=parsed,
        canonical_form=canonical,
        fingerprint=bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO")),
    )


def _load_tree(root: Traversable) -> dict[str, RecordSchema]:
    found: dict[str, RecordSchema] = {}
    for topic_dir in TOPIC_DIRS:
        directory = root.joinpath(topic_dir)
        if not directory.is_dir():
            continue
        for entry in directory.iterdir():
            if not entry.name.endswith(".avsc"):
                continue
            schema = record_schema(json.loads(entry.read_text(encoding="utf-8")))
            name = schema.record_type.__name__
            if entry.name != f"{name}.avsc":
                raise ValueError(f"{entry.name} holds the schema of {name}")
            found[name] = schema
    return found


@functools.cache
def current_schemas() -> dict[str, RecordSchema]:
    """Record name -> the current schema of that record type."""
    schemas = _load_tree(schema_root())
    missing = sorted(set(RECORD_TYPES_BY_NAME) - set(schemas))
    if missing:
        raise RuntimeError(f"no schema shipped for record types {missing}")
    return schemas


@functools.cache
def released_schemas() -> dict[str, dict[str, RecordSchema]]:
    """Released version (e.g. "v1") -> record name -> the schema released in that version."""
    released = schema_root().joinpath(RELEASED_DIR)
    if not released.is_dir():
        return {}
    return {
        version.name: _load_tree(version)
        for version in sorted(released.iterdir(), key=lambda v: v.name)
        if version.is_dir()
    }


def load_schemas() -> dict[str, dict[str, Any]]:
    """Record name -> parsed current schema (fastavro form; do not mutate)."""
    return {name: schema.parsed for name, schema in current_schemas().items()}
