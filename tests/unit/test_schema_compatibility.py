"""Every current schema must read data written with every released version (backward)."""

from __future__ import annotations

import copy
import io
import json
from typing import Any

import avro.schema
import pytest
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.strategies import record_of

from tailguard.codec import SingleObjectCodec, from_avro, to_avro
from tailguard.codec.schemas import RecordSchema, current_schemas, released_schemas
from tailguard.codec.single_object import MARKER
from tailguard.model import records as r

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


@pytest.mark.parametrize("version", sorted(released_schemas()))
@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_datum_written_with_released_schema_reads_with_current(
    version: str, data: st.DataObject
) -> None:
    for name, released in released_schemas()[version].items():
        cls = r.RECORD_TYPES_BY_NAME[name]
        record = data.draw(record_of(cls))
        current = current_schemas()[name]
        # A fresh parse of the old schema, as a producer of that release would have it.
        old = parse_schema(released.raw, named_schemas={})
        datum = schemaless_reader(io.BytesIO(_write(old, to_avro(record))), old, current.parsed)
        assert from_avro(cls, datum) == record

        # The same through the codec: a single-object message tagged with the old fingerprint.
        message = MARKER + released.fingerprint + _write(old, to_avro(record))
        assert SingleObjectCodec().decode(message) == record


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
