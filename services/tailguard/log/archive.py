"""The archive: one Avro object container file per job, the durable audit log.

Every record the agent publishes or receives (and decisions it takes locally while the services
are unreachable) is appended as an envelope holding the record's encoded bytes unchanged, so a
replay sees exactly the bytes that crossed the log. The file is a standard Avro object container
file: any Avro tool can read it.

The writer flushes a block every `flush_every` records, on `flush()` and on `close()`, so a
reader sees records while the writer still runs. A reader stops quietly at an incomplete final
block (one still being written); a damaged block before the end is an error.
"""

from __future__ import annotations

import enum
import io
import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import fastavro
from fastavro.write import Writer

from tailguard.log.codec_api import Codec
from tailguard.model.records import Record


class Direction(enum.Enum):
    PUBLISHED = "published"
    RECEIVED = "received"
    LOCAL = "local"


ENVELOPE_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "ArchiveEnvelope",
    "namespace": "tailguard.archive",
    "doc": "One record that crossed (or, when local, bypassed) the log, as it was encoded.",
    "fields": [
        {"name": "topic", "type": "string", "doc": "The topic the record belongs to."},
        {
            "name": "ts",
            "type": "long",
            "doc": "When it was archived: ms since the epoch (the record carries its own ts).",
        },
        {
            "name": "direction",
            "type": {
                "type": "enum",
                "name": "Direction",
                "symbols": [d.value for d in Direction],
                "doc": "published: sent by the archive's owner; received: read from the log; "
                "local: decided locally without the log (e.g. services unreachable).",
            },
            "doc": "How the record relates to the archive's owner.",
        },
        {
            "name": "payload",
            "type": "bytes",
            "doc": "The record's encoded bytes, exactly as on the log (single-object encoding).",
        },
    ],
}
_PARSED_SCHEMA = fastavro.parse_schema(ENVELOPE_SCHEMA)
_ENVELOPE_NAME = "tailguard.archive.ArchiveEnvelope"
_ENVELOPE_FIELDS = [f["name"] for f in ENVELOPE_SCHEMA["fields"]]

_MAGIC = b"Obj\x01"
_SYNC_SIZE = 16
_HEADER_SCHEMA = fastavro.parse_schema(
    {
        "type": "record",
        "name": "org.apache.avro.file.Header",
        "fields": [
            {"name": "magic", "type": {"type": "fixed", "name": "Magic", "size": 4}},
            {"name": "meta", "type": {"type": "map", "values": "bytes"}},
            {"name": "sync", "type": {"type": "fixed", "name": "Sync", "size": _SYNC_SIZE}},
        ],
    }
)


class ArchiveError(Exception):
    """The path is missing, is not an archive, or the archive is damaged."""


@dataclass(frozen=True, slots=True)
class Envelope:
    topic: str
    ts: int
    direction: Direction
    payload: bytes


class ArchiveWriter:
    """Appends envelopes to the archive at `path` (created, or continued if it exists)."""

    def __init__(self, path: str | Path, *, flush_every: int = 100, codec: str = "null") -> None:
        self.path = Path(path)
        self.flush_every = flush_every
        self.path.parent.mkdir(parents=True, exist_ok=True)
        existing = self.path.exists() and self.path.stat().st_size > 0
        if existing:
            # Validate before fastavro appends to it, for a clear error on a foreign file.
            ArchiveReader(self.path)
        self._file: IO[bytes] = self.path.open("a+b" if existing else "wb")
        try:
            self._writer = Writer(self._file, _PARSED_SCHEMA, codec=codec)
        except Exception:
            self._file.close()
            raise
        # The header goes out now, so a reader can open the archive before the first flush.
        self._file.flush()
        self._unflushed = 0

    def append(self, topic: str, direction: Direction | str, payload: bytes, ts: int) -> None:
        self._writer.write(
            {"topic": topic, "ts": ts, "direction": Direction(direction).value, "payload": payload}
        )
        self._unflushed += 1
        if self._unflushed >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        """Write the pending records as one block and hand it to the OS (readers see it)."""
        self._writer.flush()
        self._file.flush()
        self._unflushed = 0

    def close(self) -> None:
        if self._file.closed:
            return
        try:
            self.flush()
        finally:
            self._file.close()

    def __enter__(self) -> ArchiveWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ArchiveReader:
    """Iterates the envelopes of an archive in the order they were appended.

    Each iteration reads the file afresh, up to its last complete block, so iterating again
    picks up what a running writer has flushed since.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ArchiveError(f"no archive at {self.path}")
        with self.path.open("rb") as handle:
            self._read_header(handle)

    def _read_header(self, handle: IO[bytes]) -> tuple[dict[str, Any], str, bytes]:
        if handle.read(4) != _MAGIC:
            raise ArchiveError(f"{self.path} is not an Avro object container file (bad magic)")
        handle.seek(0)
        try:
            header = fastavro.schemaless_reader(handle, _HEADER_SCHEMA, None)
            assert isinstance(header, dict)
            meta = header["meta"]
            parsed = fastavro.parse_schema(json.loads(meta["avro.schema"]))
            codec = meta.get("avro.codec", b"null").decode()
        except ArchiveError:
            raise
        except Exception as err:
            raise ArchiveError(f"{self.path}: unreadable Avro header ({err})") from None
        if not isinstance(parsed, dict):
            raise ArchiveError(f"{self.path} is an Avro file but not a tailguard archive")
        schema: dict[str, Any] = parsed
        fields = [f["name"] for f in schema.get("fields", [])]
        if schema.get("name") != _ENVELOPE_NAME or fields != _ENVELOPE_FIELDS:
            raise ArchiveError(
                f"{self.path} is an Avro file but not a tailguard archive "
                f"(schema {schema.get('name')!r})"
            )
        if codec not in ("null", "deflate"):
            raise ArchiveError(f"{self.path}: unsupported Avro codec {codec!r}")
        return schema, codec, header["sync"]

    def __iter__(self) -> Iterator[Envelope]:
        with self.path.open("rb") as handle:
            schema, codec, sync = self._read_header(handle)
            for count, block in self._blocks(handle, sync):
                data = zlib.decompress(block, -15) if codec == "deflate" else block
                yield from self._envelopes(data, count, schema)

    def _blocks(self, handle: IO[bytes], sync: bytes) -> Iterator[tuple[int, bytes]]:
        size = self.path.stat().st_size
        while True:
            start = handle.tell()
            count = _read_long(handle)
            length = _read_long(handle) if count is not None else None
            if count is None or length is None:
                return  # end of file, or a block header still being written
            data = handle.read(length)
            marker = handle.read(_SYNC_SIZE)
            if len(data) < length or len(marker) < _SYNC_SIZE:
                return  # the final block is still being written
            if marker != sync or count < 0 or length < 0:
                raise ArchiveError(
                    f"{self.path}: damaged block at byte {start} (of {max(size, handle.tell())})"
                )
            yield count, data

    @staticmethod
    def _envelopes(data: bytes, count: int, schema: dict[str, Any]) -> Iterator[Envelope]:
        buffer = io.BytesIO(data)
        for _ in range(count):
            raw = fastavro.schemaless_reader(buffer, schema, None)
            assert isinstance(raw, dict)
            yield Envelope(raw["topic"], raw["ts"], Direction(raw["direction"]), raw["payload"])

    def records(self, codec: Codec) -> Iterator[tuple[Envelope, Record]]:
        """Each envelope with its payload decoded."""
        for envelope in self:
            yield envelope, codec.decode(envelope.payload)


def _read_long(handle: IO[bytes]) -> int | None:
    """An Avro zig-zag varint, or None at (possibly mid-number) end of file."""
    shift = 0
    accum = 0
    while True:
        byte = handle.read(1)
        if not byte:
            return None
        accum |= (byte[0] & 0x7F) << shift
        if not byte[0] & 0x80:
            return (accum >> 1) ^ -(accum & 1)
        shift += 7
