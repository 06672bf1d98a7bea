"""Record-batch streams: what flows between the parts of an attempt.

An attempt reads its inputs as streams of `pyarrow.RecordBatch`, passes them through the
chain's operators and writes them out, holding only a few batches at a time
(docs/data-plane.md, "Streamed execution"). The rules every stream here keeps:

- a stream carries no empty batch, except that a stream with no rows at all carries exactly one,
  which tells its schema (a consumer still learns the columns of an empty input, as it did when
  it got an empty table);
- the batches of one stream share one schema (`SchemaConformer`), because a file written from
  it (a result partition, a sink part) has one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa


class StreamSchemaError(ValueError):
    """Batches of one stream whose schemas cannot be made one."""


def compact(batches: list[pa.RecordBatch], schema: pa.Schema) -> pa.RecordBatch:
    """One batch of `batches`' rows, each column in one fresh buffer exactly as large as the rows
    need. A slice keeps its parent's buffers, and the IPC writer may emit bytes beyond the slice
    (string data, validity bits), so a slice and a fresh batch of the same rows would differ on
    disk; concatenation copies into exact buffers (a tenth of what compressing costs)."""
    if len(batches) > 1:
        # Concatenated column by column in C++: 13 µs against 71 µs for 13 small slices of
        # three columns gathered column by column in Python (the partition writer's case).
        # One batch is not: `combine_chunks` would keep its buffers as they are.
        try:
            return pa.Table.from_batches(batches, schema).combine_chunks().to_batches()[0]
        except pa.ArrowInvalid:
            pass  # schemas that differ in metadata: aligned column by column below
    columns = [
        pa.concat_arrays([b.column(i) for b in batches]) if batches else pa.array([], f.type)
        for i, f in enumerate(schema)
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def split_rows(batch: pa.RecordBatch, max_rows: int) -> Iterator[pa.RecordBatch]:
    """`batch` in zero-copy slices of at most `max_rows` rows (the batch itself if it fits)."""
    if batch.num_rows <= max_rows:
        yield batch
        return
    for start in range(0, batch.num_rows, max_rows):
        yield batch.slice(start, max_rows)


def as_batches(value: Any, max_rows: int) -> Iterator[pa.RecordBatch]:
    """A table, batch or pandas frame an operator returned, as batches of at most `max_rows`."""
    table = to_table(value)
    batches = table.to_batches(max_chunksize=max_rows)
    if not batches:
        yield pa.RecordBatch.from_pylist([], schema=table.schema)
        return
    yield from batches


def to_table(value: Any) -> pa.Table:
    """An operator's result as a table; a clear error for anything else."""
    if isinstance(value, pa.Table):
        return value
    if isinstance(value, pa.RecordBatch):
        return pa.Table.from_batches([value])
    pd = _pandas()
    if pd is not None and isinstance(value, pd.DataFrame):
        return pa.Table.from_pandas(value, preserve_index=False)
    raise TypeError(
        "an operator must return a pyarrow.Table, pyarrow.RecordBatch or pandas.DataFrame, "
        f"got {type(value).__name__}"
    )


def _pandas() -> Any:
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - pandas is a dependency
        return None
    return pd


def with_schema_batch(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """`batches` without empty ones, or, when none has a row, the last empty one (it carries the
    schema): the first rule of the module docstring."""
    empty: pa.RecordBatch | None = None
    any_rows = False
    for batch in batches:
        if batch.num_rows:
            any_rows = True
            yield batch
        else:
            empty = batch
    if not any_rows and empty is not None:
        yield empty


def rebatch(batches: Iterable[pa.RecordBatch], rows: int) -> Iterator[pa.RecordBatch]:
    """`batches` cut and joined into batches of exactly `rows` rows (the last may be shorter).

    Small pieces (a CSV block, a Parquet row group smaller than the batch size, many small
    partition files) are joined, so operators see batches of a predictable size whatever the
    file layout; joining copies, cutting does not. Holds less than two batches. Schemas are
    made one (`SchemaConformer`), and a stream with no rows keeps its one empty batch.
    """
    if rows < 1:
        raise ValueError(f"batch size must be at least one row, got {rows}")
    conformer = SchemaConformer()
    pending: list[pa.RecordBatch] = []
    pending_rows = 0
    for batch in with_schema_batch(batches):
        batch = conformer.conform(batch)
        if not batch.num_rows:
            yield batch
            continue
        if not pending and batch.num_rows == rows:
            yield batch  # already the right size: no copy
            continue
        pending.append(batch)
        pending_rows += batch.num_rows
        if pending_rows < rows:
            continue
        joined = compact(pending, conformer.schema_of(batch))
        full = (joined.num_rows // rows) * rows
        yield from split_rows(joined.slice(0, full), rows)
        rest = joined.num_rows - full
        pending = [joined.slice(full, rest)] if rest else []
        pending_rows = rest
    if pending:
        yield compact(pending, pending[0].schema) if len(pending) > 1 else pending[0]


class SchemaConformer:
    """Makes the batches of one stream share the schema of its first batch with rows.

    A later batch is cast to that schema when it differs (an all-null column typed `null` by
    pandas, an int32 where the first had int64); one that cannot be cast is an error naming
    both schemas and the way out (declare the output schema). Empty batches before the first
    with rows do not fix the schema: an empty pandas frame says little about its types.
    """

    def __init__(self, what: str = "the stream", schema: pa.Schema | None = None) -> None:
        self.what = what
        self.schema = schema
        self._declared = schema is not None

    def schema_of(self, batch: pa.RecordBatch) -> pa.Schema:
        return self.schema if self.schema is not None else batch.schema

    def conform(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        if self.schema is None:
            if batch.num_rows:
                self.schema = batch.schema
            return batch
        if batch.schema.equals(self.schema):
            return batch
        if self._declared and not batch.num_rows:
            # An empty result (often a frame without columns) is the declared schema's.
            return pa.RecordBatch.from_pylist([], schema=self.schema)
        if self._declared:
            batch = _select_declared(batch, self.schema, self.what)
        try:
            return batch.cast(self.schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as err:
            raise StreamSchemaError(
                f"{self.what}: a batch has schema {_schema_text(batch.schema)}, which cannot be "
                f"made {_schema_text(self.schema)} (the schema of its first batch with rows): "
                f"{err}. Return one schema from every call, or declare it with schema=..."
            ) from None


def _select_declared(batch: pa.RecordBatch, schema: pa.Schema, what: str) -> pa.RecordBatch:
    """The declared columns of `batch`, by name (PySpark's rule for mapInPandas results)."""
    missing = [name for name in schema.names if name not in batch.schema.names]
    if missing:
        raise StreamSchemaError(
            f"{what}: result has no column(s) {missing} of the declared schema "
            f"{_schema_text(schema)}; it has {batch.schema.names}"
        )
    return batch.select(schema.names)


def _schema_text(schema: pa.Schema) -> str:
    return "(" + ", ".join(f"{f.name}: {f.type}" for f in schema) + ")"


def conformed(
    batches: Iterable[pa.RecordBatch], what: str, schema: pa.Schema | None = None
) -> Iterator[pa.RecordBatch]:
    """`batches` with one schema (`SchemaConformer`); `schema`, when given, is the declared one,
    also for an empty stream."""
    conformer = SchemaConformer(what, schema)
    seen = False
    for batch in batches:
        seen = True
        yield conformer.conform(batch)
    if not seen and schema is not None:
        yield pa.RecordBatch.from_pylist([], schema=schema)


def collect(batches: Iterable[pa.RecordBatch]) -> pa.Table:
    """A whole stream as one table (a whole-partition operator's input). Schemas that differ
    between inputs (a column all-null in one producer's file) are promoted as `concat_tables`
    does; a stream without batches is a table without columns."""
    tables = [pa.Table.from_batches([b]) for b in batches]
    if not tables:
        return pa.table({})
    return pa.concat_tables(tables, promote_options="default")
