"""`tailguard export`: an archive as one row per record, in JSON Lines or Parquet.

Every row has the entry's place and how it was archived (`position`, `topic`, `direction`,
`archived_ts`), the record's `type` and its common fields (`job_id`, `id`, `ts`, `caused_by`,
empty for events). The record's own fields follow:
- JSON Lines: under `fields`, as the record's Avro datum (enums as their symbols);
- Parquet: in a struct column named after the record type (`AttemptDeploying.host`), null in
  the rows of other types. The column types come from the Avro schemas in `schemas/`, the
  contract, so a column has the same type in every export, whichever records a job produced.
Secret settings in a `JobSubmitted.config` (older archives kept every setting) are redacted.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from tailguard.codec import current_schemas, to_avro
from tailguard.inspect.describe import COMMON_FIELDS
from tailguard.inspect.history import Archived
from tailguard.model.config import redacted
from tailguard.model.records import JobSubmitted

FORMATS = ("jsonl", "parquet")
ROWS_PER_BATCH = 10_000


def rows(entries: Iterable[Archived]) -> Iterator[dict[str, Any]]:
    """One JSON-ready row per entry."""
    for position, entry in enumerate(entries):
        record = entry.record
        datum = to_avro(record)
        if isinstance(record, JobSubmitted):
            # Archives written before JobSubmitted.config was limited to policy settings may
            # hold connection settings; a secret among them is not exported.
            datum["config"] = redacted(datum["config"])
        yield {
            "position": position,
            "topic": entry.topic,
            "direction": entry.direction,
            "archived_ts": entry.archived_ts,
            "type": type(record).__name__,
            "job_id": record.job_id,
            "id": record.id,
            "ts": record.ts,
            "caused_by": list(datum.get("caused_by", ())),
            "fields": {k: v for k, v in datum.items() if k not in COMMON_FIELDS},
        }


def write_jsonl(entries: Iterable[Archived], out: IO[str]) -> int:
    count = 0
    for row in rows(entries):
        out.write(json.dumps(row, ensure_ascii=False) + "\n")
        count += 1
    return count


# --------------------------------------------------------------------------- Parquet


def _arrow_type(schema: Any, named: dict[str, Any]) -> Any:
    """The Arrow type of an Avro schema (fastavro's parsed form)."""
    import pyarrow as pa

    primitives = {
        "string": pa.string(),
        "long": pa.int64(),
        "int": pa.int32(),
        "double": pa.float64(),
        "float": pa.float32(),
        "boolean": pa.bool_(),
        "bytes": pa.binary(),
    }
    if isinstance(schema, str):
        if schema in primitives:
            return primitives[schema]
        if schema in named:
            return named[schema]
        raise ValueError(f"no Arrow type for Avro type {schema!r}")
    if isinstance(schema, list):  # a union: tailguard's schemas only use [null, T]
        members = [m for m in schema if m != "null"]
        if len(members) != 1:
            raise ValueError(f"no Arrow type for the Avro union {schema!r}")
        return _arrow_type(members[0], named)
    kind = schema["type"]
    if kind == "record":
        result = pa.struct(
            [pa.field(f["name"], _arrow_type(f["type"], named)) for f in schema["fields"]]
        )
    elif kind == "enum":
        result = pa.string()
    elif kind == "array":
        return pa.list_(_arrow_type(schema["items"], named))
    elif kind == "map":
        return pa.map_(pa.string(), _arrow_type(schema["values"], named))
    else:
        return _arrow_type(kind, named)
    named[schema["name"]] = result
    return result


def arrow_schema() -> Any:
    """The export's Arrow schema: the common columns, then a struct per record type."""
    import pyarrow as pa

    named: dict[str, Any] = {}
    columns = [
        pa.field("position", pa.int64(), nullable=False),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("direction", pa.string(), nullable=False),
        pa.field("archived_ts", pa.timestamp("ms", tz="UTC"), nullable=False),
        pa.field("type", pa.string(), nullable=False),
        pa.field("job_id", pa.string(), nullable=False),
        pa.field("id", pa.string(), nullable=False),
        pa.field("ts", pa.timestamp("ms", tz="UTC"), nullable=False),
        pa.field("caused_by", pa.list_(pa.string()), nullable=False),
    ]
    for name, schema in sorted(current_schemas().items()):
        own = [f for f in schema.parsed["fields"] if f["name"] not in COMMON_FIELDS]
        if not own:
            continue  # a record without fields of its own (Tick): Parquet has no empty struct
        struct = _arrow_type({**schema.parsed, "fields": own}, named)
        columns.append(pa.field(name, struct))
    return pa.schema(columns)


def _parquet_row(row: dict[str, Any], type_columns: set[str]) -> dict[str, Any]:
    fields = row.pop("fields")
    if row["type"] in type_columns:
        row[row["type"]] = fields
    return row


def write_parquet(entries: Iterable[Archived], path: Path) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = arrow_schema()
    type_columns = set(schema.names[9:])
    count = 0
    with pq.ParquetWriter(str(path), schema) as writer:
        batch: list[dict[str, Any]] = []
        for row in rows(entries):
            batch.append(_parquet_row(row, type_columns))
            if len(batch) >= ROWS_PER_BATCH:
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                count += len(batch)
                batch = []
        if batch or count == 0:
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))
            count += len(batch)
    return count
