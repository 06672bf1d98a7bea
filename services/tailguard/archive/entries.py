"""What one archive entry is: its Avro schema, and turning entries into records and back.

An entry (`tailguard.archive.ArchiveEntry`) holds the record itself, typed: the `record` field is
the union of every record schema (`tailguard.codec.record_union`), so any Avro reader — fastavro
or the `avro` package without tailguard, `avro-tools tojson`, `spark.read.format("avro")` — gets
the record's fields. Beside it, what a reader needs without looking inside the union:

- `topic`: the topic the record travelled on; `tailguard.commands.unauthenticated` for a command
  whose signature did not check out (kept for the audit, apart from the services' decisions);
- `ts`: when it was archived, ms since the epoch (the record carries its own `ts`);
- `direction`: `published` by the archive's owner, `received` from the log, or `local`: decided
  by the owner without the log;
- `type`: the record type's name, i.e. which branch of `record` is set;
- `job_id`, `id`: the record's job and id, for filtering without opening the union;
- `record`: the record.

Archives written before (`tailguard.archive.ArchiveEnvelope`, up to schema release v3) held
each record as its encoded bytes (`payload`); they are still read, decoded with the codec that
wrote them.

Reading resolves each entry against today's schemas by name, so an archive written with an
older union (fewer record types, older record versions) reads as today's records. An entry of a
record type this version does not know (an archive written by a newer tailguard) is an error
naming the type; entries of other types are unaffected, and plain Avro readers read it all.
"""

from __future__ import annotations

import enum
import functools
import io
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import fastavro
from fastavro.schema import to_parsing_canonical_form

from tailguard.codec import DecodeError, to_avro
from tailguard.codec.convert import from_avro
from tailguard.codec.protocol import RecordCodec
from tailguard.codec.record_union import current_union, record_union
from tailguard.codec.schemas import RecordSchema
from tailguard.model.records import RECORD_TYPES_BY_NAME, Record

ENTRY_NAME = "tailguard.archive.ArchiveEntry"
LEGACY_NAME = "tailguard.archive.ArchiveEnvelope"


class ArchiveError(Exception):
    """The path is missing, is not an archive, or the archive is damaged."""


class Direction(enum.Enum):
    PUBLISHED = "published"
    RECEIVED = "received"
    LOCAL = "local"


@dataclass(frozen=True, slots=True)
class Envelope:
    """One archive entry, read back: the record and how it was archived."""

    topic: str
    ts: int
    direction: Direction
    record: Record


_DIRECTION_TYPE: dict[str, Any] = {
    "type": "enum",
    "name": "Direction",
    "symbols": [d.value for d in Direction],
    "doc": "published: sent by the archive's owner; received: read from the log; "
    "local: decided locally without the log (e.g. services unreachable).",
}


def _common_fields(direction_type: Any) -> list[dict[str, Any]]:
    return [
        {"name": "topic", "type": "string", "doc": "The topic the record travelled on."},
        {
            "name": "ts",
            "type": "long",
            "doc": "When it was archived: ms since the epoch (the record carries its own ts).",
        },
        {
            "name": "direction",
            "type": direction_type,
            "doc": "How the record relates to the archive's owner.",
        },
    ]


def entry_schema(union: Sequence[RecordSchema]) -> dict[str, Any]:
    """The schema of a typed entry holding records of `union` (in that order)."""
    return {
        "type": "record",
        "name": "ArchiveEntry",
        "namespace": "tailguard.archive",
        "doc": "One record that crossed (or, when local, bypassed) the log.",
        "fields": [
            *_common_fields(_DIRECTION_TYPE),
            {"name": "type", "type": "string", "doc": "The record type: which branch is set."},
            {"name": "job_id", "type": "string", "doc": "The record's job_id."},
            {"name": "id", "type": "string", "doc": "The record's id."},
            {"name": "record", "type": record_union(union), "doc": "The record."},
        ],
    }


# The format written up to schema release v3: each record as the bytes that crossed the log.
LEGACY_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "ArchiveEnvelope",
    "namespace": "tailguard.archive",
    "doc": "One record that crossed (or, when local, bypassed) the log, as it was encoded.",
    "fields": [
        *_common_fields(_DIRECTION_TYPE),
        {
            "name": "payload",
            "type": "bytes",
            "doc": "The record's encoded bytes, exactly as on the log (single-object encoding).",
        },
    ],
}


@functools.cache
def current_entry_schema() -> dict[str, Any]:
    """Today's entry schema, parsed (fastavro form; do not mutate)."""
    parsed = fastavro.parse_schema(entry_schema(current_union()), named_schemas={})
    assert isinstance(parsed, dict)
    return parsed


@functools.cache
def _current_canonical_form() -> str:
    return str(to_parsing_canonical_form(current_entry_schema()))


class EntryEncoder:
    """Entries of today's schema, as the datums fastavro writes."""

    def __init__(self) -> None:
        self._names = {s.record_type: s.full_name for s in current_union()}

    def datum(self, topic: str, direction: Direction | str, record: Record, ts: int) -> Any:
        name = self._names.get(type(record))
        if name is None:
            raise TypeError(f"no schema for {type(record).__name__}: it cannot be archived")
        return {
            "topic": topic,
            "ts": ts,
            "direction": Direction(direction).value,
            "type": type(record).__name__,
            "job_id": record.job_id,
            "id": record.id,
            # fastavro's tuple notation names the union branch: no search through 20+ branches.
            "record": (name, to_avro(record)),
        }


class EntryDecoder(Protocol):
    def read(self, buffer: io.BytesIO, n: int) -> Envelope:
        """Entry number `n` (for messages), read from `buffer`'s position."""


def decoder_for(
    file_schema: dict[str, Any], location: str, legacy_codec: RecordCodec
) -> EntryDecoder:
    """How to read the entries of a file written with `file_schema` (parsed); ArchiveError for a
    file that is not a tailguard archive."""
    name = file_schema.get("name")
    fields = [f["name"] for f in file_schema.get("fields", [])]
    if name == LEGACY_NAME and fields == [f["name"] for f in LEGACY_SCHEMA["fields"]]:
        return _LegacyDecoder(file_schema, location, legacy_codec)
    if name == ENTRY_NAME and "record" in fields and "type" in fields:
        return _TypedDecoder(file_schema, location)
    raise ArchiveError(f"{location} is an Avro file but not a tailguard archive (schema {name!r})")


def is_current(file_schema: dict[str, Any]) -> bool:
    """Whether entries of today's schema can be appended to a file with `file_schema`."""
    return bool(to_parsing_canonical_form(file_schema) == _current_canonical_form())


class _TypedDecoder:
    def __init__(self, writer: dict[str, Any], location: str) -> None:
        self._writer = writer
        self._location = location
        # Resolution is needed only for a file written with another union; reading without it
        # is what keeps the common case fast.
        self._reader = None if is_current(writer) else current_entry_schema()

    def read(self, buffer: io.BytesIO, n: int) -> Envelope:
        start = buffer.tell()
        try:
            raw = self._datum(buffer, self._reader)
        except fastavro.read.SchemaResolutionError as err:
            buffer.seek(start)
            unknown = self._datum(buffer, None)["type"]
            raise ArchiveError(
                f"{self._location}: entry {n} is a {unknown} record, a type this version of "
                "tailguard does not know (the archive was written by a newer one: read it with "
                f"that version, or with any Avro reader) ({err})"
            ) from None
        branch, datum = raw["record"]
        record_type = RECORD_TYPES_BY_NAME.get(str(branch).rsplit(".", 1)[-1])
        if record_type is None:  # only a foreign file names a branch no reader schema has
            raise ArchiveError(f"{self._location}: entry {n} holds an unknown record {branch}")
        return Envelope(
            raw["topic"], raw["ts"], Direction(raw["direction"]), from_avro(record_type, datum)
        )

    def _datum(self, buffer: io.BytesIO, reader: dict[str, Any] | None) -> Any:
        return fastavro.schemaless_reader(
            buffer,
            self._writer,
            reader,
            # The entry's union of records comes back as (branch name, datum); a record's own
            # optional record fields, unions of one record, come back plain.
            return_record_name=True,
            return_record_name_override=True,
        )


class _LegacyDecoder:
    def __init__(self, writer: dict[str, Any], location: str, codec: RecordCodec) -> None:
        self._writer = writer
        self._location = location
        self._codec = codec

    def read(self, buffer: io.BytesIO, n: int) -> Envelope:
        raw: Any = fastavro.schemaless_reader(buffer, self._writer, None)
        try:
            record = self._codec.decode(raw["payload"])
        except DecodeError as err:
            raise ArchiveError(f"{self._location}: entry {n} does not decode: {err}") from None
        return Envelope(raw["topic"], raw["ts"], Direction(raw["direction"]), record)


def read_block(decoder: EntryDecoder, data: bytes, count: int, first: int) -> Iterator[Envelope]:
    """The `count` entries of one block, numbered from `first`."""
    buffer = io.BytesIO(data)
    for n in range(first, first + count):
        yield decoder.read(buffer, n)
