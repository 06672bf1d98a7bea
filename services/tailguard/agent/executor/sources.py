"""Source splits: discovered once in the driver, read inside tasks.

Splits are listed in a fixed order (sorted paths, then row groups), so every attempt of a source
subtask reads exactly the same splits: sources are speculation-safe by construction.

A source path is a local path or any `pyarrow.fs` URI (`s3://`, `s3a://`, `gs://`, `hdfs://`,
...); each split keeps the full location of its file, scheme included, and relative local paths
are made absolute in the driver (see `tailguard.filesystems`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.fs as pafs
import pyarrow.json as pa_json
import pyarrow.parquet as pq

from tailguard import filesystems

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
    fs, path = _open(split.path)
    options: dict[str, Any] = dict(source.options)
    if source.format == "parquet":
        with fs.open_input_file(path) as handle:
            return pq.ParquetFile(handle).read_row_group(
                split.row_group or 0, columns=options.get("columns")
            )
    with fs.open_input_stream(path) as stream:
        if source.format == "csv":
            convert = options.get("column_types")
            return pa_csv.read_csv(
                stream,
                convert_options=pa_csv.ConvertOptions(column_types=convert) if convert else None,
            )
        return pa_json.read_json(stream)


def read_splits(source: SourceDef, splits: list[Split]) -> pa.Table:
    tables = [read_split(source, s) for s in splits]
    if not tables:
        return pa.table({})
    return pa.concat_tables(tables, promote_options="default")
