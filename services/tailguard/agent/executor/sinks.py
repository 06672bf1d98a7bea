"""The sink commit protocol (seed flink-10644): stage per attempt, publish only the winner.

Every attempt of a sink subtask, speculative or restarted, writes its Parquet file to a path of
its own under `<storage>/<job_id>/staging/`. When the agent has picked the winner it publishes
that one file as `<sink>/part-<subtask:05d>.parquet` by rename, replacing whatever an earlier
winner of the same subtask published, so the sink never holds two outputs of one subtask or a
partial file. Losers' staging files are deleted. `finalize_sink` writes `_SUCCESS` once every
subtask is committed.

Sink directory rule (`prepare_sink`): a directory that is absent or empty is taken; one that
carries the tailguard marker (written by a previous run of a tailguard sink) has that run's
`part-*` files, temporaries and `_SUCCESS` removed; any other non-empty directory is refused
with `SinkNotEmpty`, because its files are not ours to delete or mix with.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa
import pyarrow.parquet as pq

from tailguard.agent.executor.partitions import checksum
from tailguard.agent.executor.storage import Storage

STAGING_DIR = "staging"
SUCCESS_FILE = "_SUCCESS"
SINK_MARKER = "_TAILGUARD_SINK"
_COMPRESSION = "zstd"
# Names that belong to a tailguard sink; everything else in the directory is left alone.
_OWNED_PATTERNS = ("part-*.parquet", ".part-*.tmp", SUCCESS_FILE)


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


def encode_parquet(table: pa.Table) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression=_COMPRESSION)
    return sink.getvalue()


def stage_sink_output(
    storage: Storage, job_id: str, vertex: str, subtask: int, attempt: int, table: pa.Table
) -> StagedOutput:
    data = encode_parquet(table)
    path = staging_path(storage, job_id, vertex, subtask, attempt)
    storage.write_atomic(path, data)
    return StagedOutput(path, data.size, checksum(data), subtask, attempt)


def _publish(storage: Storage, staged: StagedOutput, sink: Storage, final: str) -> None:
    if sink.same_filesystem(storage):
        try:
            sink.move(staged.path, final)
            return
        except OSError:
            # Same filesystem type but another device or bucket: fall back to a copy.
            pass
    temp = sink.temp_sibling(final)
    try:
        with storage.open_input(staged.path) as src, sink.open_output(temp) as dst:
            while chunk := src.read(8 << 20):
                dst.write(chunk)
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
    sink = Storage(sink_path)
    sink.write_atomic(sink.path(SUCCESS_FILE), b"")
