"""Source splits: discovered once in the driver, read inside tasks.

Splits are listed in a fixed order (sorted paths, then row groups), so every attempt of a source
subtask reads exactly the same splits: sources are speculation-safe by construction.

A source path is a local path or any `pyarrow.fs` URI (`s3://`, `s3a://`, `gs://`, `hdfs://`,
...); each split keeps the full location of its file, scheme included, and relative local paths
are made absolute in the driver (see `tailguard.filesystems`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.fs as pafs
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from tailguard import filesystems
from tailguard.agent.executor.batches import split_rows

SourceFormat = Literal["parquet", "csv", "json"]


@dataclass
class SourceDef:
    format: SourceFormat
    paths: tuple[str, ...]
    # Read options handed to pyarrow (e.g. csv column types); kept picklable.
    options: dict[str, Any] = field(default_factory=dict)


_SUFFIXES = {"parquet": (".parquet", ".pq"), "csv": (".csv",), "json": (".json", ".jsonl")}


class SourceError(ValueError):
    """A source path that does not exist, cannot be opened or holds no readable file."""


@dataclass(frozen=True)
class Split:
    # A normalised location (an absolute path, or a URI with its scheme kept), so an executor
    # opens the same file whatever its working directory and filesystem defaults.
    path: str
    row_group: int | None  # Parquet: the row group; other formats: the whole file
    bytes: int


def _open(location: str) -> tuple[pafs.FileSystem, str]:
    try:
        return filesystems.open_location(location)
    except filesystems.LocationError as err:
        raise SourceError(f"source {err}") from None


def _files(source: SourceDef) -> list[tuple[pafs.FileSystem, str, str, int]]:
    """(filesystem, path inside it, location, size) of every file of `source`, in order."""
    suffixes = _SUFFIXES[source.format]
    found: list[tuple[pafs.FileSystem, str, str, int]] = []
    for given in source.paths:
        fs, path = _open(given)
        location = filesystems.normalise(given)
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.NotFound:
            raise SourceError(f"source path not found: {location}")
        if info.type == pafs.FileType.Directory:
            listed = fs.get_file_info(pafs.FileSelector(path, recursive=True))
            files = sorted(
                (f for f in listed if f.type == pafs.FileType.File and f.path.endswith(suffixes)),
                key=lambda f: f.path,
            )
            if not files:
                raise SourceError(f"no {source.format} files under {location}")
            found.extend(
                (fs, f.path, filesystems.child_location(location, path, f.path), f.size or 0)
                for f in files
            )
        else:
            found.append((fs, path, location, info.size or 0))
    return found


def discover_splits(source: SourceDef) -> list[Split]:
    splits: list[Split] = []
    for fs, path, location, size in _files(source):
        if source.format == "parquet":
            with fs.open_input_file(path) as handle:
                metadata = pq.ParquetFile(handle).metadata
            for index in range(metadata.num_row_groups):
                group = metadata.row_group(index)
                # Compressed size is what is read from storage, the honest "input bytes".
                compressed = sum(
                    group.column(c).total_compressed_size for c in range(group.num_columns)
                )
                splits.append(Split(location, index, compressed))
        else:
            splits.append(Split(location, None, size))
    return splits


def read_split(source: SourceDef, split: Split) -> pa.Table:
    """One whole split as a table (for tools and tests; attempts stream with `split_batches`)."""
    batches = [batch for batch, _ in split_batches(source, split, _WHOLE_SPLIT_ROWS)]
    return pa.Table.from_batches(batches)


def read_splits(source: SourceDef, splits: list[Split]) -> pa.Table:
    """Splits as one table (for tools and tests)."""
    tables = [read_split(source, s) for s in splits]
    if not tables:
        return pa.table({})
    return pa.concat_tables(tables, promote_options="default")


# Rows per batch when a whole split is wanted at once.
_WHOLE_SPLIT_ROWS = 1 << 30
# Bytes read from a Parquet file at a time while its pages are decoded.
PARQUET_BUFFER_BYTES = 1 << 20
# Bytes of a CSV or JSON-lines file parsed at a time (pyarrow's own default). A block holds about
# this much text; its batch is cut to the batch size afterwards.
TEXT_BLOCK_BYTES = 1 << 20


def split_batches(
    source: SourceDef, split: Split, batch_rows: int
) -> Iterator[tuple[pa.RecordBatch, int]]:
    """The split's record batches, each with the bytes of the split it accounts for (their sum
    is `split.bytes`, for progress), without ever holding the whole split: Parquet by row group
    and batch (`ParquetFile.iter_batches`), CSV and JSON lines by block of text
    (`pyarrow.csv.open_csv`, `pyarrow.json.open_json`). A split without rows yields one empty
    batch carrying its schema.

    Column types of CSV and JSON are inferred from the first block, as Spark infers them from a
    sample: a column whose values change type later needs `column_types=` (CSV)."""
    fs, path = _open(split.path)
    if source.format == "parquet":
        with fs.open_input_file(path) as handle:
            yield from _parquet_batches(source, split, handle, batch_rows)
        return
    # A random-access file, for `tell`: how far the parser has read, for progress.
    with fs.open_input_file(path) as stream:
        reader = _text_reader(source, stream, split)
        yield from _text_batches(reader, stream, split, batch_rows)


def _parquet_batches(
    source: SourceDef, split: Split, handle: pa.NativeFile, batch_rows: int
) -> Iterator[tuple[pa.RecordBatch, int]]:
    # Pages are read through a small buffer as they are decoded, not the row group's column
    # chunks at once (pre-buffering): reading a 9.7 MiB row group took Arrow's allocation peak
    # from 32.2 to 26.0 MiB (benchmarks/memory.py's input).
    parquet = pq.ParquetFile(handle, pre_buffer=False, buffer_size=PARQUET_BUFFER_BYTES)
    group = split.row_group or 0
    columns = source.options.get("columns")
    total_rows = parquet.metadata.row_group(group).num_rows
    if total_rows == 0:
        schema = parquet.schema_arrow
        if columns is not None:
            schema = pa.schema([schema.field(c) for c in columns])
        yield pa.RecordBatch.from_pylist([], schema=schema), split.bytes
        return
    accounted = 0
    rows_read = 0
    for batch in parquet.iter_batches(
        batch_size=batch_rows, row_groups=[group], columns=columns, use_threads=False
    ):
        rows_read += batch.num_rows
        # The row group's compressed bytes in proportion to the rows read so far, so the last
        # batch brings the sum to exactly the split's bytes.
        upto = split.bytes * rows_read // total_rows
        yield batch, upto - accounted
        accounted = upto


def _text_reader(source: SourceDef, stream: pa.NativeFile, split: Split) -> Any:
    if source.format == "csv":
        convert = source.options.get("column_types")
        return pa_csv.open_csv(
            stream,
            read_options=pa_csv.ReadOptions(block_size=TEXT_BLOCK_BYTES, use_threads=False),
            convert_options=pa_csv.ConvertOptions(column_types=convert) if convert else None,
        )
    return pa_json.open_json(
        stream, read_options=pa_json.ReadOptions(block_size=TEXT_BLOCK_BYTES, use_threads=False)
    )


def _text_batches(
    reader: Any, stream: pa.NativeFile, split: Split, batch_rows: int
) -> Iterator[tuple[pa.RecordBatch, int]]:
    accounted = 0
    any_batch = False
    while True:
        try:
            block = reader.read_next_batch()
        except StopIteration:
            break
        except pa.ArrowInvalid as err:
            raise SourceError(
                f"{split.path}: {err} (column types are inferred from the first "
                f"{TEXT_BLOCK_BYTES >> 20} MiB; give them with column_types=...)"
            ) from None
        # The bytes the parser has taken from the file so far (it reads a block ahead).
        upto = min(split.bytes, stream.tell())
        pieces = list(split_rows(block, batch_rows))
        for index, piece in enumerate(pieces):
            any_batch = True
            yield piece, (upto - accounted if index == len(pieces) - 1 else 0)
            if index == len(pieces) - 1:
                accounted = upto
    if not any_batch:
        yield pa.RecordBatch.from_pylist([], schema=reader.schema), split.bytes
    elif accounted < split.bytes:
        # Whatever the parser read without a batch for it (a trailing newline): accounted for
        # with an empty batch, so the split's bytes add up.
        yield pa.RecordBatch.from_pylist([], schema=reader.schema), split.bytes - accounted
