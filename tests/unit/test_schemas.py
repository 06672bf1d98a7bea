"""The .avsc contracts and the record dataclasses must never drift apart."""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import itertools
import json
import re
import subprocess
import sys
import types
import typing
from pathlib import Path
from typing import Any

import pytest
from fastavro import parse_schema
from fastavro.schema import to_parsing_canonical_form

from tailguard.codec.schemas import current_schemas, released_schemas, schema_root
from tailguard.model import records as r

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "io.tailguard"
TOPIC_DIRS = {r.EVENTS_TOPIC: "events", r.FINDINGS_TOPIC: "findings", r.COMMANDS_TOPIC: "commands"}
PRIMITIVES = {str: "string", int: "long", float: "double", bool: "boolean"}


class _NamedTypes:
    """Named types seen so far in one schema: the first use defines, later ones reference."""

    def __init__(self) -> None:
        self.defined: dict[str, Any] = {}

    def resolve(self, avro_type: Any) -> Any:
        if isinstance(avro_type, str) and avro_type in self.defined:
            return self.defined[avro_type]
        if isinstance(avro_type, dict) and avro_type.get("type") in ("record", "enum"):
            full = f"{avro_type.get('namespace', NAMESPACE)}.{avro_type['name']}"
            assert full not in self.defined, f"{full} defined twice"
            self.defined[full] = avro_type
        return avro_type


def _assert_matches(hint: Any, avro_type: Any, named: _NamedTypes, where: str) -> None:
    avro_type = named.resolve(avro_type)
    if hint in PRIMITIVES:
        assert avro_type == PRIMITIVES[hint], f"{where}: {avro_type!r} for {hint!r}"
        return
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is types.UnionType or origin is typing.Union:
        assert isinstance(avro_type, list), f"{where}: optional field is not a union"
        assert len(avro_type) == 2 and avro_type[0] == "null", f"{where}: not [null, T]"
        (inner,) = [a for a in args if a is not type(None)]
        _assert_matches(inner, avro_type[1], named, where)
        return
    assert not isinstance(avro_type, list), f"{where}: union for a required field"
    if origin is tuple:
        assert avro_type["type"] == "array", where
        _assert_matches(args[0], avro_type["items"], named, f"{where}[]")
    elif origin is dict:
        assert args[0] is str and avro_type["type"] == "map", where
        _assert_matches(args[1], avro_type["values"], named, f"{where}{{}}")
    elif isinstance(hint, type) and issubclass(hint, enum.Enum):
        assert avro_type["type"] == "enum" and avro_type["name"] == hint.__name__, where
        assert avro_type["symbols"] == [m.name for m in hint], f"{where}: enum symbols differ"
        assert avro_type.get("doc"), f"{where}: enum without doc"
    else:
        assert dataclasses.is_dataclass(hint), f"{where}: unexpected hint {hint!r}"
        _assert_record_matches(hint, avro_type, named)


def _expected_default(f: dataclasses.Field[Any], hint: Any) -> Any:
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        return None
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return dataclasses.MISSING
    if isinstance(value, enum.Enum):
        return value.name
    return list(value) if isinstance(value, tuple) else value


def _assert_record_matches(cls: type, schema: dict[str, Any], named: _NamedTypes) -> None:
    assert schema["type"] == "record" and schema["name"] == cls.__name__
    assert schema.get("namespace", NAMESPACE) == NAMESPACE
    assert schema.get("doc"), f"{cls.__name__} has no doc"
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    assert [f["name"] for f in schema["fields"]] == [f.name for f in fields], cls.__name__
    for f, avro_field in zip(fields, schema["fields"], strict=True):
        where = f"{cls.__name__}.{f.name}"
        assert avro_field.get("doc"), f"{where} has no doc"
        _assert_matches(hints[f.name], avro_field["type"], named, where)
        expected = _expected_default(f, hints[f.name])
        if expected is dataclasses.MISSING:
            assert "default" not in avro_field, f"{where}: default the dataclass does not have"
        else:
            assert avro_field.get("default", dataclasses.MISSING) == expected, where


@pytest.mark.parametrize("cls", r.RECORD_TYPES, ids=lambda c: c.__name__)
def test_schema_matches_dataclass_field_for_field(cls: type[r.Record]) -> None:
    path = REPO / "schemas" / TOPIC_DIRS[cls.TOPIC] / f"{cls.__name__}.avsc"
    _assert_record_matches(cls, json.loads(path.read_text()), _NamedTypes())


def test_every_record_type_has_exactly_one_schema_with_its_own_fingerprint() -> None:
    schemas = current_schemas()
    assert set(schemas) == {cls.__name__ for cls in r.RECORD_TYPES}
    files = sorted(p.stem for d in TOPIC_DIRS.values() for p in (REPO / "schemas" / d).iterdir())
    assert files == sorted(schemas)
    fingerprints = {s.fingerprint for s in schemas.values()}
    assert len(fingerprints) == len(schemas)


def _release_order(version: str) -> int:
    assert re.fullmatch(r"v[1-9][0-9]*", version), f"release directory {version!r} is not vN"
    return int(version[1:])


def _releases() -> list[str]:
    """Released versions, oldest first (by number: v10 comes after v9)."""
    return sorted(released_schemas(), key=_release_order)


def test_the_newest_release_is_complete_and_equals_the_current_schemas() -> None:
    # Releasing copies the current schemas; a record type added since the last release means a
    # release is due (and the compatibility test cannot cover a type no release holds).
    versions = _releases()
    assert versions[:2] == ["v1", "v2"]
    newest = released_schemas()[versions[-1]]
    assert set(newest) == {cls.__name__ for cls in r.RECORD_TYPES}
    for name, schema in current_schemas().items():
        assert newest[name].fingerprint == schema.fingerprint, f"{name} changed since release"


def test_each_release_holds_a_subset_of_the_next() -> None:
    # Record types are added, never removed: a consumer must go on reading every old type.
    versions = _releases()
    for older, newer in itertools.pairwise(versions):
        missing = set(released_schemas()[older]) - set(released_schemas()[newer])
        assert not missing, f"{newer} dropped {sorted(missing)} that {older} released"


def _off_topic_forms(version: str) -> list[str]:
    """Canonical forms of a release's schemas of records kept off the three topics (from v5:
    the fleet list, `blocklist/FleetBlock.avsc`), which `released_schemas` does not load."""
    release = REPO / "schemas" / "released" / version
    return [
        to_parsing_canonical_form(parse_schema(json.loads(path.read_text()), named_schemas={}))
        for path in sorted(release.glob("*/*.avsc"))
        if path.parent.name not in TOPIC_DIRS.values()
    ]


def _release_digest(version: str) -> str:
    forms = sorted(s.canonical_form for s in released_schemas()[version].values())
    forms += _off_topic_forms(version)
    return hashlib.sha256("\n".join(forms).encode()).hexdigest()[:16]


# Released directories are frozen: the canonical forms (docs aside) of each one, pinned here.
RELEASED_DIGESTS = {
    "v1": "57936d85fcda9b78",
    "v2": "a5c757f91357308a",
    "v3": "5d07312017e2afc8",
    "v4": "e9b1ce82f62795e8",
    "v5": "9f9dd9b0275f9bf6",
    "v6": "7691d83bfcd26bd0",
    "v7": "0318ba1e2ff96e3e",
    "v8": "703b11adc43edf48",
}


@pytest.mark.parametrize("version", sorted(RELEASED_DIGESTS))
def test_released_versions_are_never_edited(version: str) -> None:
    assert _release_digest(version) == RELEASED_DIGESTS[version]


def test_v2_added_attempt_progress_and_vertex_operators_to_v1() -> None:
    v1, v2 = released_schemas()["v1"], released_schemas()["v2"]
    assert set(v2) - set(v1) == {"AttemptProgress"}

    def vertex_fields(schema: dict[str, Any]) -> list[str]:
        graph = next(f for f in schema["fields"] if f["name"] == "graph")["type"]
        vertices = next(f for f in graph["fields"] if f["name"] == "vertices")["type"]
        return [f["name"] for f in vertices["items"]["fields"]]

    old = vertex_fields(v1["JobSubmitted"].raw)
    assert vertex_fields(v2["JobSubmitted"].raw) == [*old, "operators"]


def test_v3_added_non_recoverable_to_attempt_failed() -> None:
    v2, v3 = released_schemas()["v2"], released_schemas()["v3"]
    assert set(v3) == set(v2)
    changed = {name for name in v3 if v3[name].fingerprint != v2[name].fingerprint}
    assert changed == {"AttemptFailed"}
    added = [f for f in v3["AttemptFailed"].raw["fields"] if f["name"] == "non_recoverable"]
    assert added == [
        {"name": "non_recoverable", "doc": added[0]["doc"], "type": "boolean", "default": False}
    ]


def test_v4_added_min_parallelism_to_vertex_spec() -> None:
    v3, v4 = released_schemas()["v3"], released_schemas()["v4"]
    assert set(v4) == set(v3)
    changed = {name for name in v4 if v4[name].fingerprint != v3[name].fingerprint}
    assert changed == {"JobSubmitted"}
    graph = next(f for f in v4["JobSubmitted"].raw["fields"] if f["name"] == "graph")["type"]
    vertices = next(f for f in graph["fields"] if f["name"] == "vertices")["type"]
    added = vertices["items"]["fields"][-1]
    assert added == {
        "name": "min_parallelism",
        "doc": added["doc"],
        "type": ["null", "long"],
        "default": None,
    }


def test_v5_added_job_recovered_and_released_the_fleet_list() -> None:
    v4, v5 = released_schemas()["v4"], released_schemas()["v5"]
    assert set(v5) - set(v4) == {"JobRecovered"}
    assert all(v5[name].fingerprint == v4[name].fingerprint for name in v4)
    # The fleet list's schema travels with the records' releases from v5 on (it was in none).
    fleet = REPO / "schemas" / "released" / "v5" / "blocklist" / "FleetBlock.avsc"
    assert json.loads(fleet.read_text()) == json.loads(
        (REPO / "schemas" / "blocklist" / "FleetBlock.avsc").read_text()
    )
    assert _off_topic_forms("v4") == [] and len(_off_topic_forms("v5")) == 1


def test_v6_added_slow_hosts_to_slow_tasks_detected() -> None:
    v5, v6 = released_schemas()["v5"], released_schemas()["v6"]
    assert set(v6) == set(v5)
    changed = {name for name in v6 if v6[name].fingerprint != v5[name].fingerprint}
    assert changed == {"SlowTasksDetected"}
    added = v6["SlowTasksDetected"].raw["fields"][-1]
    assert added == {
        "name": "slow_hosts",
        "doc": added["doc"],
        "type": {"type": "array", "items": "string"},
        "default": [],
    }


def test_v7_added_the_services_policy_settings() -> None:
    v6, v7 = released_schemas()["v6"], released_schemas()["v7"]
    assert set(v7) - set(v6) == {"FindingSettings", "CommandSettings"}
    assert all(v7[name].fingerprint == v6[name].fingerprint for name in v6)
    # Each on the topic of the outputs it comes before (the detector's on the findings).
    assert (REPO / "schemas" / "released" / "v7" / "findings" / "FindingSettings.avsc").exists()
    assert (REPO / "schemas" / "released" / "v7" / "commands" / "CommandSettings.avsc").exists()
    fields = [f["name"] for f in v7["CommandSettings"].raw["fields"]]
    assert fields[-5:] == ["service", "version", "settings", "explicit", "job_settings"]


def _crc64_avro(data: bytes) -> bytes:
    """The Avro spec's reference CRC-64-AVRO, written out independently of fastavro."""
    empty = 0xC15D213AA4D7A795
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (empty & -(fp & 1))
        table.append(fp)
    fp = empty
    for byte in data:
        fp = (fp >> 8) ^ table[(fp ^ byte) & 0xFF]
    return fp.to_bytes(8, "little")


def test_fingerprints_are_crc64_avro_of_the_canonical_form() -> None:
    for schema in current_schemas().values():
        assert schema.fingerprint == _crc64_avro(schema.canonical_form.encode())
        assert '"doc"' not in schema.canonical_form


def test_generator_output_equals_the_committed_schemas() -> None:
    # The committed files are the contract; this only says whether tools/gen_schemas.py still
    # reproduces them, so that rerunning it after a dataclass change gives a reviewable diff.
    result = subprocess.run(
        [sys.executable, str(REPO / "tools" / "gen_schemas.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_schemas_are_found_from_the_package_not_the_working_directory(tmp_path: Path) -> None:
    script = (
        "from tailguard.codec import load_schemas, released_schemas\n"
        "from tailguard.codec.schemas import schema_root\n"
        "released = released_schemas()\n"
        "newest = max(released, key=lambda v: int(v[1:]))\n"
        "print(len(load_schemas()), len(released[newest]), schema_root())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    count, released_count, root = result.stdout.split(maxsplit=2)
    assert int(count) == int(released_count) == len(r.RECORD_TYPES)
    assert Path(root.strip()).resolve() == Path(str(schema_root())).resolve()
