"""Avro single-object encoding: the spec's way to tag a message with its schema, no registry.

A message is `C3 01`, the 8-byte little-endian CRC-64-AVRO fingerprint of the writer schema's
canonical form, and the schemaless Avro body. Decoding knows the fingerprint of every current
and every released schema, so data written by an older release is read into today's records
through Avro schema resolution.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from tailguard.codec.body import BodyReader, write_record
from tailguard.codec.errors import DecodeError
from tailguard.codec.framing import as_bytes
from tailguard.codec.schemas import RecordSchema, current_schemas, released_schemas
from tailguard.model.records import Record

MARKER = b"\xc3\x01"
HEADER_SIZE = len(MARKER) + 8


class SingleObjectCodec:
    name = "single-object"

    def __init__(
        self,
        current: Mapping[str, RecordSchema] | None = None,
        released: Iterable[Mapping[str, RecordSchema]] | None = None,
    ) -> None:
        current = current_schemas() if current is None else current
        released = released_schemas().values() if released is None else released
        self._writers: dict[type[Record], tuple[bytes, RecordSchema]] = {
            s.record_type: (MARKER + s.fingerprint, s) for s in current.values()
        }
        self._readers: dict[bytes, BodyReader] = {}
        for version in [*released, current]:
            for writer in version.values():
                reader = current[writer.record_type.__name__]
                self._readers[writer.fingerprint] = BodyReader(writer, reader)

    def encode(self, record: Record) -> bytes:
        try:
            header, schema = self._writers[type(record)]
        except KeyError:
            raise TypeError(f"no schema for {type(record).__name__}") from None
        return write_record(header, schema, record)

    def decode(self, data: bytes) -> Record:
        data = as_bytes(data)
        if data[:2] != MARKER:
            raise DecodeError(
                f"wrong marker {data[:2].hex(' ') or '(empty)'}: expected c3 01 "
                "(Avro single-object encoding)"
            )
        if len(data) < HEADER_SIZE:
            raise DecodeError(
                f"truncated header: {len(data)} bytes, the marker and fingerprint take "
                f"{HEADER_SIZE}"
            )
        fingerprint = data[2:HEADER_SIZE]
        reader = self._readers.get(fingerprint)
        if reader is None:
            raise DecodeError(
                f"unknown schema fingerprint {fingerprint.hex()}: not a current or released "
                "tailguard record schema"
            )
        return reader.read(data, HEADER_SIZE, f"fingerprint {fingerprint.hex()}")
