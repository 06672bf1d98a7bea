"""The Avro binary body shared by both framings: write a record, read one back strictly."""

from __future__ import annotations

import io
from typing import Any

from fastavro import schemaless_reader, schemaless_writer

from tailguard.codec.convert import from_avro, to_avro
from tailguard.codec.errors import DecodeError
from tailguard.codec.schemas import RecordSchema
from tailguard.model.records import Record


def write_record(header: bytes, schema: RecordSchema, record: Record) -> bytes:
    buf = io.BytesIO()
    buf.write(header)
    schemaless_writer(buf, schema.parsed, to_avro(record))
    return buf.getvalue()


class BodyReader:
    """Reads bodies written with `writer` as records of the current schema `reader`."""

    __slots__ = ("_reader_schema", "reader", "writer")

    def __init__(self, writer: RecordSchema, reader: RecordSchema) -> None:
        self.writer = writer
        self.reader = reader
        # Resolution is only needed when the writer used another version; skipping it when the
        # canonical forms match is what keeps the common case fast.
        self._reader_schema = (
            None if writer.canonical_form == reader.canonical_form else reader.parsed
        )

    def read(self, data: bytes, offset: int, source: str) -> Record:
        """The record in `data[offset:]`, which must hold exactly one body.

        `source` names what the body was found by (a fingerprint, a schema id) for messages.
        """
        buf = io.BytesIO(data)
        buf.seek(offset)
        try:
            datum: Any = schemaless_reader(buf, self.writer.parsed, self._reader_schema)
        except Exception as exc:
            # fastavro signals bad input with whatever the failing step raised (EOFError,
            # IndexError, UnicodeDecodeError, ...); a consumer must only ever see DecodeError.
            if buf.tell() >= len(data) or isinstance(exc, EOFError):
                raise DecodeError(
                    f"truncated {self._what(source)}: {len(data) - offset} bytes end mid-record "
                    f"({type(exc).__name__}: {exc})"
                ) from exc
            raise DecodeError(
                f"malformed {self._what(source)}: {type(exc).__name__}: {exc}"
            ) from exc
        trailing = len(data) - buf.tell()
        if trailing:
            raise DecodeError(f"{trailing} trailing bytes after the {self._what(source)}")
        try:
            return from_avro(self.reader.record_type, datum)
        except Exception as exc:
            raise DecodeError(
                f"malformed {self._what(source)}: {type(exc).__name__}: {exc}"
            ) from exc

    def _what(self, source: str) -> str:
        return f"{self.writer.record_type.__name__} body ({source})"
