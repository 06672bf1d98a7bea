"""BLOCKING result partitions as files: one Arrow IPC file per subpartition, with a checksum.

Layout under a storage root (see docs/data-plane.md):

    <job_id>/_running.json                                      who runs the job (crash sweeping)
    <job_id>/partitions/<vertex>/<subtask>/<attempt>/<sp>.arrow  one file per subpartition
    <job_id>/partitions/<vertex>/<subtask>/<attempt>/_complete.json  written last: the checksums

Every attempt writes into its own directory, so a speculative twin never touches the winner's
files. Files are written with `Storage.write_atomic` (a renamed temporary on a local disk or
HDFS, one upload on an object store), so a reader finds a file complete or not at all, and the
completion marker goes last: on S3, whose reads after a write are strongly consistent, a reader
that sees the marker sees every file. The checksum is a hash of the file's bytes; the writer
makes the bytes a function of the table's content alone (one chunk, fixed batch size, fixed
codec), so a partition re-produced from the same inputs carries the same checksum, which the
failover core uses to spare the consumers a restart.

The completion marker is what a PIPELINED consumer waits for: deployed together with its producer
(FLIP-119), it cannot be handed the checksums by the driver, so it reads them from the marker. The
exchange is at partition granularity: the consumer starts reading once the whole partition is
written, not record by record.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import pyarrow as pa

from tailguard.agent.executor.storage import Storage
from tailguard.model.records import PartitionRef

PARTITIONS_DIR = "partitions"
COMPLETE_MARKER = "_complete.json"
RUNNING_MARKER = "_running.json"
_CODEC = "zstd"
# A fixed batch size makes the file layout independent of how the producer's table was chunked.
_BATCH_ROWS = 64 * 1024


class PartitionError(Exception):
    """A consumed partition cannot be used; names the producer attempt that must be redone."""

    def __init__(self, partition: PartitionRef, message: str) -> None:
        super().__init__(message)
        self.partition = partition


class PartitionMissing(PartitionError):
    pass


class PartitionCorrupt(PartitionError):
    pass


@dataclass(frozen=True)
class WrittenPartition:
    records: int
    bytes_per_subpartition: tuple[int, ...]
    checksums: tuple[str, ...]


def checksum(data: bytes | pa.Buffer) -> str:
    return hashlib.blake2b(memoryview(data), digest_size=16).hexdigest()


# ---------------------------------------------------------------------- layout


def partition_dir(storage: Storage, job_id: str, partition: PartitionRef) -> str:
    return storage.path(
        job_id, PARTITIONS_DIR, partition.vertex, partition.subtask, partition.attempt
    )


def completion_marker_path(storage: Storage, job_id: str, partition: PartitionRef) -> str:
    return f"{partition_dir(storage, job_id, partition)}/{COMPLETE_MARKER}"


def subpartition_path(
    storage: Storage, job_id: str, partition: PartitionRef, subpartition: int
) -> str:
    return f"{partition_dir(storage, job_id, partition)}/{subpartition}.arrow"


# ---------------------------------------------------------------------- writing


def _compact(table: pa.Table) -> pa.Table:
    """One fresh chunk per column with buffers exactly as large as the rows need.

    A slice keeps its parent's buffers, and the IPC writer may emit bytes beyond the slice
    (string data, validity bits), so a slice and a fresh table of the same rows would differ
    on disk. Concatenation copies into exact buffers; it costs a tenth of compressing.
    """
    columns = [
        pa.concat_arrays(column.chunks) if column.num_chunks else column.combine_chunks()
        for column in table.columns
    ]
    return pa.Table.from_arrays(columns, schema=table.schema)


def encode_table(table: pa.Table) -> pa.Buffer:
    """The IPC file bytes of `table`: identical for identical content, however it is chunked
    or sliced."""
    canonical = _compact(table)
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=_CODEC)
    with pa.ipc.new_file(sink, canonical.schema, options=options) as writer:
        writer.write_table(canonical, max_chunksize=_BATCH_ROWS)
    return sink.getvalue()


def write_partition(
    storage: Storage, job_id: str, partition: PartitionRef, tables: list[pa.Table]
) -> WrittenPartition:
    """Write `tables[i]` as subpartition i of `partition` (an empty table still gets a file,
    carrying the schema, so every consumer finds what it expects)."""
    sizes: list[int] = []
    sums: list[str] = []
    records = 0
    for index, table in enumerate(tables):
        data = encode_table(table)
        storage.write_atomic(subpartition_path(storage, job_id, partition, index), data)
        sizes.append(data.size)
        sums.append(checksum(data))
        records += table.num_rows
    written = WrittenPartition(records, tuple(sizes), tuple(sums))
    # Last, after every file is in place: a consumer that sees the marker can read them all.
    marker = json.dumps(asdict(written), sort_keys=True).encode()
    storage.write_atomic(completion_marker_path(storage, job_id, partition), marker)
    return written


def read_completion(storage: Storage, job_id: str, partition: PartitionRef) -> WrittenPartition:
    """What the completion marker of `partition` records; FileNotFoundError while it is not
    written, PartitionCorrupt when it cannot be parsed."""
    path = completion_marker_path(storage, job_id, partition)
    if not storage.exists(path):
        raise FileNotFoundError(path)
    try:
        fields = json.loads(bytes(storage.read_bytes(path)))
        return WrittenPartition(
            int(fields["records"]),
            tuple(int(b) for b in fields["bytes_per_subpartition"]),
            tuple(str(c) for c in fields["checksums"]),
        )
    except (ValueError, KeyError, TypeError) as err:
        raise PartitionCorrupt(partition, f"completion marker {path} unreadable: {err}") from err


def await_partition(
    storage: Storage,
    job_id: str,
    partition: PartitionRef,
    timeout_s: float,
    abandon: Callable[[], str | None],
    poll_s: float = 0.05,
) -> WrittenPartition:
    """Wait until the producer attempt `partition` has written its whole partition and return
    its checksums (a pipelined consumer's read). `abandon` is polled too: a reason it returns
    (this attempt or the producer was cancelled) ends the wait, as does the timeout, with
    PartitionMissing naming the producer attempt."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return read_completion(storage, job_id, partition)
        except FileNotFoundError:
            pass
        reason = abandon()
        if reason is not None:
            raise PartitionMissing(partition, f"stopped waiting for {_name(partition)}: {reason}")
        if time.monotonic() >= deadline:
            raise PartitionMissing(
                partition, f"{_name(partition)} not complete within {timeout_s:.0f} s"
            )
        time.sleep(poll_s)  # polling the shared storage: it has no change notification


def _name(partition: PartitionRef) -> str:
    return f"pipelined partition {partition.vertex}#{partition.subtask} attempt {partition.attempt}"


# ---------------------------------------------------------------------- reading


def _read_file(storage: Storage, path: str, partition: PartitionRef, expected: str) -> pa.Buffer:
    try:
        data = storage.read_bytes(path)
    except FileNotFoundError:
        raise PartitionMissing(partition, f"result partition file {path} is missing") from None
    except OSError as err:
        # Object stores report a missing key as a generic OSError.
        if not storage.exists(path):
            raise PartitionMissing(partition, f"result partition file {path} is missing") from None
        raise PartitionCorrupt(
            partition, f"result partition file {path} unreadable: {err}"
        ) from err
    actual = checksum(data)
    if actual != expected:
        raise PartitionCorrupt(
            partition,
            f"result partition file {path} has checksum {actual}, expected {expected}",
        )
    return data


def _decode(data: pa.Buffer, path: str, partition: PartitionRef) -> pa.Table:
    try:
        return pa.ipc.open_file(pa.BufferReader(data)).read_all()
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as err:
        raise PartitionCorrupt(
            partition, f"result partition file {path} unreadable: {err}"
        ) from err


def read_subpartitions(
    storage: Storage,
    job_id: str,
    producer_vertex: str,
    attempts: dict[int, int],
    partition_range: tuple[int, int],
    subpartition_range: tuple[int, int],
    checksums: dict[tuple[int, int], str],
    on_file: Callable[[int, int], None] | None = None,
) -> tuple[pa.Table, int]:
    """Read subpartitions `subpartition_range` of producer subtasks `partition_range` (both
    inclusive) from their winning `attempts`, verifying every file against `checksums`
    (keyed by (producer subtask, subpartition)). Returns the rows in (subtask, subpartition)
    order, so a re-run reads the same table, and the number of bytes read. `on_file` is called
    with (rows, bytes) after each file."""
    first_p, last_p = partition_range
    first_sp, last_sp = subpartition_range
    if first_p > last_p or first_sp > last_sp:
        raise ValueError(f"empty range: partitions {partition_range}, {subpartition_range}")
    tables: list[pa.Table] = []
    read_bytes = 0
    for producer_subtask in range(first_p, last_p + 1):
        ref = PartitionRef(producer_vertex, producer_subtask, attempts[producer_subtask])
        for sp in range(first_sp, last_sp + 1):
            path = subpartition_path(storage, job_id, ref, sp)
            data = _read_file(storage, path, ref, checksums[(producer_subtask, sp)])
            table = _decode(data, path, ref)
            tables.append(table)
            read_bytes += data.size
            if on_file is not None:
                # Per file: progress reporting and the cooperative cancellation check.
                on_file(table.num_rows, data.size)
    # Producers may disagree trivially (a column all-null in one file is typed `null` there).
    return pa.concat_tables(tables, promote_options="default"), read_bytes


# ---------------------------------------------------------------------- cleanup


def release_partition(storage: Storage, job_id: str, partition: PartitionRef) -> None:
    storage.delete_dir(partition_dir(storage, job_id, partition))


def sweep_job(storage: Storage, job_id: str) -> None:
    """Remove everything the job keeps under the storage root: its partitions, its sink staging
    leftovers, and its running marker (so it is not swept again as abandoned)."""
    storage.delete_dir(storage.path(job_id))


@dataclass(frozen=True)
class JobOwner:
    """The driver process running a job: enough to tell later whether it is still alive."""

    host: str
    pid: int
    started_ms: int

    @staticmethod
    def current() -> JobOwner:
        return JobOwner(socket.gethostname(), os.getpid(), int(time.time() * 1000))


def mark_job_running(storage: Storage, job_id: str, owner: JobOwner) -> None:
    payload = json.dumps(asdict(owner), sort_keys=True).encode()
    storage.write_atomic(storage.path(job_id, RUNNING_MARKER), payload)


def read_job_owner(storage: Storage, job_id: str) -> JobOwner | None:
    """The marker's owner, or None when there is no readable marker."""
    path = storage.path(job_id, RUNNING_MARKER)
    try:
        fields = json.loads(bytes(storage.read_bytes(path)))
        return JobOwner(str(fields["host"]), int(fields["pid"]), int(fields["started_ms"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def sweep_abandoned(storage: Storage, is_alive: Callable[[JobOwner], bool]) -> list[str]:
    """Remove the trees of jobs whose driver died without cleaning up; returns their ids.

    Only directories with a marker are considered: a tree without one is either finished
    (its marker is removed with it) or not tailguard's, and neither may be deleted here.
    """
    swept: list[str] = []
    for job_id in storage.list_dir(storage.root):
        owner = read_job_owner(storage, job_id)
        if owner is not None and not is_alive(owner):
            storage.delete_dir(storage.path(job_id))
            swept.append(job_id)
    return swept


def prepare_job_storage(storage: Storage, job_id: str) -> list[str]:
    """What the agent does with the storage when a job starts: sweep the trees of jobs whose
    driver on this host died, then mark this job as run by this process. Returns the swept ids."""
    swept = sweep_abandoned(storage, local_owner_alive)
    mark_job_running(storage, job_id, JobOwner.current())
    return swept


def _boot_time_s() -> float | None:
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return None


def _process_start_ms(pid: int) -> int | None:
    """When `pid` started (Linux /proc), or None when that cannot be told."""
    boot = _boot_time_s()
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    if boot is None:
        return None
    # Field 22 (starttime, in clock ticks since boot); the command name (field 2) may contain
    # spaces, so count from the closing parenthesis.
    fields = stat.rsplit(")", 1)[1].split()
    ticks = int(fields[19])
    return int((boot + ticks / os.sysconf("SC_CLK_TCK")) * 1000)


def local_owner_alive(owner: JobOwner, hostname: str | None = None) -> bool:
    """Liveness as far as this machine can tell: an owner on another host counts as alive
    (its files are not ours to judge); a local pid that no longer exists, or that was reused
    by a process started after the job, counts as dead."""
    if owner.host != (hostname or socket.gethostname()):
        return True
    try:
        os.kill(owner.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    started = _process_start_ms(owner.pid)
    # Slack for clock-tick rounding: the job's marker is written after its process starts.
    return started is None or started <= owner.started_ms + 1000
