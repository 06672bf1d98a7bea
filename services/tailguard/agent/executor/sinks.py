"""The sink commit protocol (seed flink-10644): stage per attempt, publish only the winner.

Every attempt of a sink subtask, speculative or restarted, writes its Parquet file to a path of
its own under `<storage>/<job_id>/staging/`. When the agent has picked the winner it publishes
that one file as `<sink>/part-<subtask:05d>.parquet`, replacing whatever an earlier winner of the
same subtask published, so the sink never holds two outputs of one subtask. Losers' staging
files are deleted. `finalize_sink` writes `_SUCCESS` once every subtask is committed: a JSON
manifest naming every committed file and its size, as one atomic write, last.

The commit point is `_SUCCESS`, on every store: a reader that waits for it and reads the files
it names reads exactly the committed output. How a part file is published depends on the store
(docs/storage.md): a rename on a local disk or HDFS (HDFS replaces by delete-then-rename), a
server-side copy on an object store (S3 has no rename), or, across filesystems, a copy that is
renamed into place or, on an object store, uploaded straight to the final name. Either way the
published size is checked against what the attempt reported before the commit counts.

Sink directory rule (`prepare_sink`): a directory that is absent or empty is taken; one that
carries the tailguard marker (written by a previous run of a tailguard sink) has that run's
`part-*` files, temporaries and `_SUCCESS` removed; any other non-empty directory is refused
with `SinkNotEmpty`, because its files are not ours to delete or mix with.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq

from tailguard.agent.executor.batches import rebatch
from tailguard.agent.executor.partitions import atomic_output
from tailguard.agent.executor.storage import Storage

STAGING_DIR = "staging"
SUCCESS_FILE = "_SUCCESS"
SINK_MARKER = "_TAILGUARD_SINK"
_COMPRESSION = "zstd"
# Names that belong to a tailguard sink; everything else in the directory is left alone.
_PART_PATTERN = "part-*.parquet"
_OWNED_PATTERNS = (_PART_PATTERN, ".part-*.tmp", SUCCESS_FILE)
# S3's CopyObject copies at most 5 GiB in one request, and pyarrow's `move` is one request.
_SERVER_SIDE_COPY_MAX_BYTES = 5 << 30
_COPY_CHUNK_BYTES = 8 << 20


@dataclass
class SinkDef:
    """Where a sink vertex writes: the committed files land under `path`."""

    format: Literal["parquet"]
    path: str


class SinkNotEmpty(Exception):
    """The sink directory holds files that no tailguard sink wrote."""


@dataclass(frozen=True)
class StagedOutput:
    path: str  # inside the job's storage filesystem
    bytes: int
    checksum: str
    subtask: int
    attempt: int


def part_name(subtask: int) -> str:
    return f"part-{subtask:05d}.parquet"


def staging_path(storage: Storage, job_id: str, vertex: str, subtask: int, attempt: int) -> str:
    return storage.path(job_id, STAGING_DIR, vertex, subtask, attempt, part_name(subtask))


def stage_sink_batches(
    storage: Storage,
    job_id: str,
    vertex: str,
    subtask: int,
    attempt: int,
    batches: Iterable[pa.RecordBatch],
    batch_rows: int,
) -> tuple[StagedOutput, int]:
    """Write the attempt's output to its staging file as the batches arrive, one Parquet row
    group per `batch_rows` rows (batches are joined or cut to that size first: a row group per
    small batch would make a file of tiny row groups). Returns what commit needs and the rows.

    The file appears whole or not at all (`atomic_output`); an error leaves nothing staged.
    A stream without batches is written as a file without columns."""
    path = staging_path(storage, job_id, vertex, subtask, attempt)
    rows = 0
    with atomic_output(storage, path) as sink:
        writer: pq.ParquetWriter | None = None
        try:
            for batch in rebatch(batches, batch_rows):
                if writer is None:
                    writer = _parquet_writer(sink, batch.schema)
                if batch.num_rows:
                    writer.write_batch(batch)
                    rows += batch.num_rows
            if writer is None:
                writer = _parquet_writer(sink, pa.schema([]))
        finally:
            if writer is not None:
                writer.close()
    return StagedOutput(path, sink.size, sink.checksum, subtask, attempt), rows


# A column chunk's dictionary page may grow to this many bytes before its column falls back to
# plain encoding. Until it falls back or the row group ends, the writer keeps the column's data
# pages in memory (the dictionary page must come first in the file): with Parquet's 1 MiB
# default, writing 250,000-row batches of seven mostly high-cardinality columns grew the
# process by 65 MiB for a 13.5 MiB batch, at 64 KiB by 6 MiB. Low-cardinality columns (a few
# thousand distinct values) stay dictionary-encoded.
DICTIONARY_PAGE_LIMIT_BYTES = 64 << 10


def _parquet_writer(sink: Any, schema: pa.Schema) -> pq.ParquetWriter:
    return pq.ParquetWriter(
        sink,
        schema,
        compression=_COMPRESSION,
        dictionary_pagesize_limit=DICTIONARY_PAGE_LIMIT_BYTES,
    )


def stage_sink_output(
    storage: Storage, job_id: str, vertex: str, subtask: int, attempt: int, table: pa.Table
) -> StagedOutput:
    """`stage_sink_batches` for a whole table (tools and tests)."""
    staged, _ = stage_sink_batches(
        storage,
        job_id,
        vertex,
        subtask,
        attempt,
        table.to_batches() or [pa.RecordBatch.from_pylist([], schema=table.schema)],
        max(1, table.num_rows),
    )
    return staged


def _copy(storage: Storage, src: str, sink: Storage, dst: str) -> None:
    with storage.open_input(src) as reader, sink.open_output(dst) as writer:
        while chunk := reader.read(_COPY_CHUNK_BYTES):
            writer.write(chunk)


def _publish(storage: Storage, staged: StagedOutput, sink: Storage, final: str) -> None:
    renamable = not sink.object_store or staged.bytes <= _SERVER_SIDE_COPY_MAX_BYTES
    if renamable and sink.same_filesystem(storage):
        try:
            sink.move(staged.path, final)
            return
        except OSError:
            # Same filesystem type but another device or bucket: fall back to a copy.
            pass
    if sink.object_store:
        # Straight to the final name: the upload appears once complete. Closing it after a
        # failed read would publish the part copied so far, so any failure deletes the
        # object; `_SUCCESS` is not written yet, so no reader that trusts it has looked.
        try:
            _copy(storage, staged.path, sink, final)
        except BaseException:
            sink.delete_file(final)
            raise
    else:
        temp = sink.temp_sibling(final)
        try:
            _copy(storage, staged.path, sink, temp)
            sink.move(temp, final)
        except BaseException:
            sink.delete_file(temp)
            raise
    storage.delete_file(staged.path)


def commit_sink_output(storage: Storage, staged: StagedOutput, sink_path: str) -> str:
    """Publish the winner's staged file; returns the published path (inside the sink's fs)."""
    size = storage.size(staged.path)
    if size != staged.bytes:
        # Never publish a file other than the one the attempt reported finishing.
        raise OSError(f"staged sink file {staged.path} has {size} bytes, expected {staged.bytes}")
    sink = Storage(sink_path)
    final = sink.path(part_name(staged.subtask))
    _publish(storage, staged, sink, final)
    published = sink.size(final)
    if published != staged.bytes:
        raise OSError(
            f"published sink file {sink.uri}/{part_name(staged.subtask)} has {published} "
            f"bytes, expected {staged.bytes}"
        )
    storage.delete_dir(staged.path.rsplit("/", 1)[0])
    return final


def abort_staged(storage: Storage, staged: StagedOutput) -> None:
    """Drop a losing or cancelled attempt's staged output (missing is fine)."""
    storage.delete_dir(staged.path.rsplit("/", 1)[0])


def prepare_sink(sink_path: str) -> None:
    """Make the sink directory ready for a run, by the rule in the module docstring."""
    sink = Storage(sink_path)
    names = sink.list_dir(sink.root)
    if names and SINK_MARKER not in names:
        raise SinkNotEmpty(
            f"sink {sink.uri} is not empty and was not written by tailguard "
            f"(no {SINK_MARKER}); refusing to write into it"
        )
    # `_SUCCESS` goes first: a reader must never see it next to a half-cleared directory.
    sink.delete_file(sink.path(SUCCESS_FILE))
    for name in names:
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in _OWNED_PATTERNS):
            sink.delete_file(sink.path(name))
    sink.fs.create_dir(sink.root, recursive=True)
    if SINK_MARKER not in names:
        sink.write_atomic(sink.path(SINK_MARKER), b"")


def finalize_sink(sink_path: str) -> None:
    """Write the commit point: `_SUCCESS`, a manifest of the committed files and sizes."""
    sink = Storage(sink_path)
    files = {
        name: size
        for name, size in sink.list_sizes(sink.root).items()
        if fnmatch.fnmatchcase(name, _PART_PATTERN)
    }
    manifest = {"committer": "tailguard", "files": files}
    sink.write_atomic(sink.path(SUCCESS_FILE), json.dumps(manifest, sort_keys=True).encode())


def committed_files(sink_path: str) -> dict[str, int] | None:
    """The committed files of a sink and their sizes, from its `_SUCCESS` manifest; None while
    the sink is not committed. What a reader that must be exact reads."""
    sink = Storage(sink_path)
    try:
        manifest = json.loads(bytes(sink.read_bytes(sink.path(SUCCESS_FILE))))
    except FileNotFoundError:
        return None
    except OSError:
        if sink.exists(sink.path(SUCCESS_FILE)):
            raise
        return None
    except ValueError as err:
        raise ValueError(f"{sink.uri}/{SUCCESS_FILE} is not a tailguard manifest: {err}") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        raise ValueError(f"{sink.uri}/{SUCCESS_FILE} is not a tailguard manifest (no files)")
    return {str(name): int(size) for name, size in files.items()}
