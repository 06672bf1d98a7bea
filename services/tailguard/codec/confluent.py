"""Confluent wire format through a Schema Registry (`confluent_kafka.schema_registry`).

A message is the magic byte 0, the 4-byte big-endian schema id and the schemaless Avro body.
Each record type is registered lazily, on its first encode, under the subject
`<topic>-<record full name>` (Confluent's TopicRecordNameStrategy: one topic carries many record
types). Decoding looks the writer schema up by id, once per id, and reads it into the current
record through Avro schema resolution.

Only a registry's "not found" is a DecodeError (the bytes name a schema nobody registered); a
registry that cannot be reached raises its own error, since the message itself may be fine and
must not go to the dead-letter topic.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tailguard.codec.body import BodyReader, write_record
from tailguard.codec.errors import DecodeError
from tailguard.codec.framing import as_bytes
from tailguard.codec.schemas import RecordSchema, current_schemas, record_schema
from tailguard.model.records import Record

if TYPE_CHECKING:
    # Imported where used: the registry client pulls in httpx and authlib (~0.2 s), which every
    # process importing tailguard.codec would pay at start, with or without a registry.
    from confluent_kafka.schema_registry import SchemaRegistryClient

MAGIC = b"\x00"
HEADER_SIZE = 5
_NOT_FOUND = 404


def subject_for(schema: RecordSchema) -> str:
    return f"{schema.record_type.TOPIC}-{schema.full_name}"


class ConfluentCodec:
    name = "confluent"

    def __init__(
        self,
        client: SchemaRegistryClient,
        current: Mapping[str, RecordSchema] | None = None,
    ) -> None:
        self._client = client
        self._current = current_schemas() if current is None else current
        self._headers: dict[type[Record], tuple[bytes, RecordSchema]] = {}
        self._readers: dict[int, BodyReader] = {}
        self._lock = threading.Lock()

    @property
    def client(self) -> SchemaRegistryClient:
        return self._client

    def encode(self, record: Record) -> bytes:
        entry = self._headers.get(type(record)) or self._register(type(record))
        header, schema = entry
        return write_record(header, schema, record)

    def decode(self, data: bytes) -> Record:
        data = as_bytes(data)
        if data[:1] != MAGIC:
            raise DecodeError(
                f"wrong marker {data[:1].hex() or '(empty)'}: expected magic byte 00 "
                "(Confluent wire format)"
            )
        if len(data) < HEADER_SIZE:
            raise DecodeError(
                f"truncated header: {len(data)} bytes, the magic byte and schema id take "
                f"{HEADER_SIZE}"
            )
        schema_id = int.from_bytes(data[1:HEADER_SIZE], "big")
        reader = self._readers.get(schema_id) or self._lookup(schema_id)
        return reader.read(data, HEADER_SIZE, f"schema id {schema_id}")

    def _register(self, record_type: type[Record]) -> tuple[bytes, RecordSchema]:
        schema = self._current.get(record_type.__name__)
        if schema is None:
            raise TypeError(f"no schema for {record_type.__name__}")
        from confluent_kafka.schema_registry import Schema

        with self._lock:
            schema_id = self._client.register_schema(
                subject_for(schema), Schema(json.dumps(schema.raw), "AVRO")
            )
            entry = (MAGIC + schema_id.to_bytes(4, "big"), schema)
            self._headers[record_type] = entry
        return entry

    def _lookup(self, schema_id: int) -> BodyReader:
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            registered = self._client.get_schema(schema_id)
        except SchemaRegistryError as exc:
            if exc.http_status_code == _NOT_FOUND:
                raise DecodeError(f"unknown schema id {schema_id}: {exc}") from exc
            raise
        if (registered.schema_type or "AVRO") != "AVRO":
            raise DecodeError(f"schema id {schema_id} is a {registered.schema_type} schema")
        try:
            raw: Any = json.loads(registered.schema_str or "")
            writer = record_schema(raw)
        except Exception as exc:
            raise DecodeError(
                f"schema id {schema_id} is not a tailguard record schema: {exc}"
            ) from exc
        reader = self._current[writer.record_type.__name__]
        if writer.full_name != reader.full_name:
            raise DecodeError(
                f"schema id {schema_id} names {writer.full_name}, expected {reader.full_name}"
            )
        body_reader = BodyReader(writer, reader)
        self._readers[schema_id] = body_reader
        return body_reader
