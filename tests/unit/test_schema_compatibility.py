"""Every current schema must read data written with every released version (backward)."""

from __future__ import annotations

import copy
import dataclasses
import io
import json
from typing import Any

import avro.schema
import pytest
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.examples_budget import examples
from tests.strategies import record_of

from tailguard.codec import SingleObjectCodec, from_avro, to_avro
from tailguard.codec.schemas import RecordSchema, current_schemas, released_schemas
from tailguard.codec.single_object import MARKER
from tailguard.model import records as r

NAMESPACE = "io.tailguard"

RELEASED = [
    (version, name, schema)
    for version, schemas in released_schemas().items()
    for name, schema in schemas.items()
]


def _compatibility(reader: dict[str, Any], writer: dict[str, Any]) -> Any:
    return ReaderWriterCompatibilityChecker().get_compatibility(
        avro.schema.parse(json.dumps(reader)), avro.schema.parse(json.dumps(writer))
    )


@pytest.mark.parametrize(
    ("version", "name", "released"), RELEASED, ids=[f"{v}-{n}" for v, n, _ in RELEASED]
)
def test_current_schema_reads_released_version(
    version: str, name: str, released: RecordSchema
) -> None:
    current = current_schemas()[name]
    result = _compatibility(current.raw, released.raw)
    assert result.compatibility is SchemaCompatibilityType.compatible, (
        f"{name}: current cannot read {version}: {result.messages} at {result.locations}"
    )


def test_the_checker_catches_an_incompatible_change() -> None:
    # Guards the test above against passing vacuously: a new required field without a default,
    # or a removed enum symbol, must be reported.
    writer = current_schemas()["AttemptFailed"].raw
    reader = copy.deepcopy(writer)
    reader["fields"].append({"name": "retries", "type": "long", "doc": "new"})
    assert _compatibility(reader, writer).compatibility is SchemaCompatibilityType.incompatible
    reader = copy.deepcopy(writer)
    error_type = next(f for f in reader["fields"] if f["name"] == "error")["type"]
    error_type["symbols"].remove("INFRA")
    assert _compatibility(reader, writer).compatibility is SchemaCompatibilityType.incompatible


def _write(schema: dict[str, Any], datum: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    schemaless_writer(buf, schema, datum)
    return buf.getvalue()


def _named_definitions(avro_type: Any, found: dict[str, Any]) -> dict[str, Any]:
    """Full name -> definition of every named type in a schema, wherever it is defined."""
    if isinstance(avro_type, list):
        for branch in avro_type:
            _named_definitions(branch, found)
    elif isinstance(avro_type, dict):
        kind = avro_type["type"]
        if kind in ("record", "enum"):
            found[f"{avro_type.get('namespace', NAMESPACE)}.{avro_type['name']}"] = avro_type
        if kind == "record":
            for f in avro_type["fields"]:
                _named_definitions(f["type"], found)
        elif kind == "array":
            _named_definitions(avro_type["items"], found)
        elif kind == "map":
            _named_definitions(avro_type["values"], found)
    return found


def _field_default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    raise AssertionError(f"{f.name} is not in an old schema and has no default: incompatible")


def _as_held_by_writer(value: Any, avro_type: Any, named: dict[str, Any]) -> Any:
    """`value` as a producer of an older release could hold it.

    A field the older schema does not have did not exist for that producer: it is at its
    dataclass default. Reading the old data must give exactly this, so the dataclass defaults
    and the Avro defaults are checked against each other here, independently of the reader.
    """
    if isinstance(avro_type, str):
        avro_type = named.get(avro_type, avro_type)
    if value is None:
        return None
    if isinstance(avro_type, list):
        (inner,) = [branch for branch in avro_type if branch != "null"]
        return _as_held_by_writer(value, inner, named)
    if not isinstance(avro_type, dict):
        return value
    kind = avro_type["type"]
    if kind == "record":
        written = {f["name"]: f["type"] for f in avro_type["fields"]}
        return dataclasses.replace(
            value,
            **{
                f.name: _as_held_by_writer(getattr(value, f.name), written[f.name], named)
                if f.name in written
                else _field_default(f)
                for f in dataclasses.fields(value)
            },
        )
    if kind == "array":
        return tuple(_as_held_by_writer(item, avro_type["items"], named) for item in value)
    if kind == "map":
        return {k: _as_held_by_writer(v, avro_type["values"], named) for k, v in value.items()}
    return value


def as_held_by_writer(record: r.Record, released: RecordSchema) -> r.Record:
    held: r.Record = _as_held_by_writer(record, released.raw, _named_definitions(released.raw, {}))
    return held


def test_a_field_added_after_a_release_is_at_its_default_for_that_release() -> None:
    # Guards the property test below against comparing a record with itself.
    submitted = r.JobSubmitted(
        job_id="j",
        ts=1,
        id="j-e0",
        name="sales",
        graph=r.JobGraphSpec(
            vertices=(
                r.VertexSpec("sales→score", r.VertexKind.SOURCE, operators=("sales", "score")),
            ),
            edges=(),
        ),
        config={},
    )
    v1 = as_held_by_writer(submitted, released_schemas()["v1"]["JobSubmitted"])
    assert isinstance(v1, r.JobSubmitted)
    assert v1.graph.vertices[0].operators == ()
    assert (
        dataclasses.replace(v1.graph.vertices[0], operators=("sales", "score"))
        == (submitted.graph.vertices[0])
    )
    assert as_held_by_writer(submitted, released_schemas()["v2"]["JobSubmitted"]) == submitted


def test_v1_job_submitted_decodes_with_no_operators() -> None:
    released = released_schemas()["v1"]["JobSubmitted"]
    vertex = r.VertexSpec("sales", r.VertexKind.SOURCE, parallelism=4, split_bytes=(10, 20))
    record = r.JobSubmitted(
        job_id="j",
        ts=1,
        id="j-e0",
        name="sales",
        graph=r.JobGraphSpec(vertices=(vertex,), edges=()),
        config={"k": "v"},
    )
    datum = to_avro(record)
    for v in datum["graph"]["vertices"]:
        del v["operators"]  # what a v1 producer wrote
    decoded = SingleObjectCodec().decode(
        MARKER + released.fingerprint + _write(released.parsed, datum)
    )
    assert decoded == record
    assert isinstance(decoded, r.JobSubmitted) and decoded.graph.vertices[0].operators == ()


@pytest.mark.parametrize("version", sorted(released_schemas()))
@settings(max_examples=examples(20), deadline=None)
@given(data=st.data())
def test_datum_written_with_released_schema_reads_with_current(
    version: str, data: st.DataObject
) -> None:
    for name, released in released_schemas()[version].items():
        cls = r.RECORD_TYPES_BY_NAME[name]
        record = data.draw(record_of(cls))
        expected = as_held_by_writer(record, released)
        current = current_schemas()[name]
        # A fresh parse of the old schema, as a producer of that release would have it. The
        # writer drops the fields its schema does not have, as the old producer never had them.
        old = parse_schema(released.raw, named_schemas={})
        datum = schemaless_reader(io.BytesIO(_write(old, to_avro(record))), old, current.parsed)
        assert from_avro(cls, datum) == expected

        # The same through the codec: a single-object message tagged with the old fingerprint.
        message = MARKER + released.fingerprint + _write(old, to_avro(record))
        assert SingleObjectCodec().decode(message) == expected


def test_an_evolved_schema_reads_v1_data_through_resolution() -> None:
    # What a second release will look like: a new optional field. The codec, given v1 as a
    # released version and the evolved schema as current, must decode v1 messages with the new
    # field at its default.
    v1 = released_schemas()["v1"]["NodeRemoved"]
    evolved_raw = copy.deepcopy(v1.raw)
    evolved_raw["fields"].append(
        {"name": "note", "type": ["null", "string"], "default": None, "doc": "test only"}
    )
    assert _compatibility(evolved_raw, v1.raw).compatibility is SchemaCompatibilityType.compatible
    evolved = parse_schema(evolved_raw, named_schemas={})
    record = r.NodeRemoved(job_id="j", ts=5, id="j-e5", host="127.0.0.2", reason="lost")
    old_bytes = _write(v1.parsed, to_avro(record))
    datum = schemaless_reader(io.BytesIO(old_bytes), v1.parsed, evolved)
    assert datum == {**to_avro(record), "note": None}
