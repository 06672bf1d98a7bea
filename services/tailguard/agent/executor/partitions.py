"""BLOCKING result partitions as files: one Arrow IPC file per subpartition, with a checksum.

Layout under a storage root (see docs/data-plane.md):

    <job_id>/_running.json                                      who runs the job (crash sweeping)
    <job_id>/partitions/<vertex>/<subtask>/<attempt>/<sp>.arrow  one file per subpartition
    <job_id>/partitions/<vertex>/<subtask>/<attempt>/_complete.json  written last: the checksums

Every attempt writes into its own directory, so a speculative twin never touches the winner's
files. Files are written as the attempt's batches arrive (`PartitionWriter`), through
`atomic_output`: a hidden temporary renamed into place on a local disk or HDFS, a local spool
uploaded in one piece on an object store, so a reader finds a file complete or not at all; the
completion marker goes last: on S3, whose reads after a write are strongly consistent, a reader
that sees the marker sees every file. The checksum is a hash of the file's bytes, taken as they
are written; the writer makes the bytes a function of the rows alone (record batches cut at
fixed row counts, each compacted, fixed codec), however the rows arrived in batches, so a
partition re-produced from the same inputs carries the same checksum, which the failover core
uses to spare the consumers a restart.

The completion marker is what a PIPELINED consumer waits for: deployed together with its producer
(FLIP-119), it cannot be handed the checksums by the driver, so it reads them from the marker. The
exchange is at partition granularity: the consumer starts reading once the whole partition is
written, not record by record.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

import pyarrow as pa
import pyarrow.ipc

from tailguard.agent.executor.batches import compact
from tailguard.agent.executor.storage import Storage
from tailguard.model.records import PartitionRef

PARTITIONS_DIR = "partitions"
COMPLETE_MARKER = "_complete.json"
RUNNING_MARKER = "_running.json"
_CODEC = "zstd"


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

# The fewest rows in one record batch of a subpartition file (unless the batch size is smaller):
# below it, per-batch metadata and compression calls outweigh the rows (zstd over a 1M-row
# partition: 256-row batches took 3.5x as long as 1024-row ones).
MIN_FILE_BATCH_ROWS = 1024
# Bytes copied at a time when a local spool is uploaded or a file is hashed.
COPY_CHUNK_BYTES = 8 << 20


def file_batch_rows(batch_rows: int, subpartitions: int) -> int:
    """Rows per record batch in each of `subpartitions` files written together.

    A file's rows are cut into batches of exactly this many (the last shorter), whatever batches
    they arrived in: the bytes depend on the rows alone. The writer holds at most this many rows
    per subpartition, so splitting the batch size among the subpartitions keeps what a writer
    holds near one batch (`subpartitions` × `MIN_FILE_BATCH_ROWS` at most, for wide exchanges).
    """
    share = -(-batch_rows // max(1, subpartitions))
    return min(batch_rows, max(MIN_FILE_BATCH_ROWS, share))


class _HashingOutput:
    """A file-like sink for pyarrow's writers: passes bytes on, hashing and counting them."""

    def __init__(self, out: pa.NativeFile) -> None:
        self._out = out
        self._hash = hashlib.blake2b(digest_size=16)
        self.size = 0
        self.closed = False

    def write(self, data: bytes | memoryview | pa.Buffer) -> int:
        view = memoryview(data)
        self._hash.update(view)
        self._out.write(view)
        self.size += view.nbytes
        return view.nbytes

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        pass

    def close(self) -> None:
        # The underlying output belongs to `atomic_output`, which closes (publishes) it.
        self.closed = True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readable(self) -> bool:
        return False

    @property
    def checksum(self) -> str:
        return self._hash.hexdigest()


@contextlib.contextmanager
def atomic_output(storage: Storage, path: str) -> Iterator[_HashingOutput]:
    """A sink for writing `path` piece by piece so that it appears complete or not at all; the
    sink's `checksum` and `size` are those of the file written.

    On a local disk or HDFS the pieces go to a hidden temporary next to `path`, renamed into place
    at the end. On an object store a stream fed piece by piece would publish what it holds when
    closed after an error, and every open upload buffers its parts in memory, so the pieces go to
    a local spool file, uploaded under the final name at the end (an upload that fails half-way
    is deleted). On any error nothing is left under `path`.
    """
    if storage.object_store:
        with tempfile.TemporaryDirectory(prefix="tailguard-spool-") as spool:
            local = os.path.join(spool, "file")
            with pa.OSFile(local, "wb") as out:
                hashing = _HashingOutput(out)
                yield hashing
            _upload(local, storage, path)
        return
    temp = storage.temp_sibling(path)
    try:
        with storage.open_output(temp) as out:
            hashing = _HashingOutput(out)
            yield hashing
        storage.move(temp, path)
    except BaseException:
        storage.delete_file(temp)
        raise


def _upload(local: str, storage: Storage, path: str) -> None:
    try:
        with pa.OSFile(local, "rb") as source, storage.open_output(path) as out:
            while chunk := source.read(COPY_CHUNK_BYTES):
                out.write(chunk)
    except BaseException:
        storage.delete_file(path)
        raise


class _SubpartitionFile:
    """One subpartition's file while it is written: rows wait until a file batch is full."""

    def __init__(self, storage: Storage, path: str, batch_rows: int) -> None:
        self.storage = storage
        self.path = path
        self.batch_rows = batch_rows
        self.pending: list[pa.RecordBatch] = []
        self.pending_rows = 0
        self.records = 0
        self.schema: pa.Schema | None = None
        self._stack = contextlib.ExitStack()
        self._sink: _HashingOutput | None = None
        self._writer: pa.ipc.RecordBatchFileWriter | None = None

    def add(self, batch: pa.RecordBatch, own_copy: bool) -> None:
        if self.schema is None:
            self.schema = batch.schema
        if not batch.num_rows:
            return
        # A small slice of a large batch would keep all of that batch alive while it waits:
        # a copy holds only its own rows.
        self.pending.append(compact([batch], batch.schema) if own_copy else batch)
        self.pending_rows += batch.num_rows
        while self.pending_rows >= self.batch_rows:
            self._write_first(self.batch_rows)

    def _write_first(self, rows: int) -> None:
        taken: list[pa.RecordBatch] = []
        needed = rows
        while needed:
            head = self.pending[0]
            if head.num_rows <= needed:
                taken.append(self.pending.pop(0))
                needed -= head.num_rows
            else:
                taken.append(head.slice(0, needed))
                self.pending[0] = head.slice(needed)
                needed = 0
        self.pending_rows -= rows
        schema = self.schema if self.schema is not None else taken[0].schema
        self._open(schema).write_batch(compact(taken, schema))
        self.records += rows

    def _open(self, schema: pa.Schema) -> pa.ipc.RecordBatchFileWriter:
        if self._writer is None:
            self._sink = self._stack.enter_context(atomic_output(self.storage, self.path))
            options = pa.ipc.IpcWriteOptions(compression=_CODEC)
            self._writer = pa.ipc.new_file(self._sink, schema, options=options)
        return self._writer

    def finish(self) -> tuple[int, str]:
        """Write what waits, close and publish the file; (bytes, checksum)."""
        if self.pending_rows:
            self._write_first(self.pending_rows)
        # A subpartition with no rows still gets a file carrying the schema.
        writer = self._open(self.schema if self.schema is not None else pa.schema([]))
        writer.close()
        assert self._sink is not None
        sink = self._sink
        self._stack.close()
        return sink.size, sink.checksum

    def abort(self) -> None:
        exc = RuntimeError("partition write abandoned")
        self._stack.__exit__(type(exc), exc, None)


class PartitionWriter:
    """Writes one attempt's result partition as its batches arrive: `add` a batch's pieces (one
    per subpartition), then `finish` (publishes the files, then the completion marker) or
    `abort` (leaves nothing behind)."""

    def __init__(
        self,
        storage: Storage,
        job_id: str,
        partition: PartitionRef,
        subpartitions: int,
        batch_rows: int,
    ) -> None:
        if subpartitions < 1:
            raise ValueError(f"need at least one subpartition, got {subpartitions}")
        self.storage = storage
        self.job_id = job_id
        self.partition = partition
        rows = file_batch_rows(batch_rows, subpartitions)
        self._files = [
            _SubpartitionFile(storage, subpartition_path(storage, job_id, partition, sp), rows)
            for sp in range(subpartitions)
        ]

    def add(self, pieces: list[pa.RecordBatch]) -> None:
        if len(pieces) != len(self._files):
            raise ValueError(f"{len(pieces)} pieces for {len(self._files)} subpartitions")
        own_copy = len(pieces) > 1
        for file, piece in zip(self._files, pieces, strict=True):
            file.add(piece, own_copy)

    def finish(self) -> WrittenPartition:
        sizes: list[int] = []
        sums: list[str] = []
        try:
            for file in self._files:
                size, digest = file.finish()
                sizes.append(size)
                sums.append(digest)
        except BaseException:
            self.abort()
            raise
        written = WrittenPartition(sum(f.records for f in self._files), tuple(sizes), tuple(sums))
        # Last, after every file is in place: a consumer that sees the marker can read them all.
        marker = json.dumps(asdict(written), sort_keys=True).encode()
        self.storage.write_atomic(
            completion_marker_path(self.storage, self.job_id, self.partition), marker
        )
        return written

    def abort(self) -> None:
        for file in self._files:
            file.abort()


# Rows per file batch of `write_partition` (the batch size of an attempt that writes whole
# tables at once).
_TABLE_BATCH_ROWS = 64 * 1024


def write_partition(
    storage: Storage, job_id: str, partition: PartitionRef, tables: list[pa.Table]
) -> WrittenPartition:
    """Write `tables[i]` as subpartition i of `partition` (an empty table still gets a file,
    carrying the schema, so every consumer finds what it expects)."""
    writer = PartitionWriter(storage, job_id, partition, len(tables), _TABLE_BATCH_ROWS)
    empties = [_empty_batch(t.schema) for t in tables]
    try:
        for index, table in enumerate(tables):
            for batch in table.to_batches() or [empties[index]]:
                writer.add([*empties[:index], batch, *empties[index + 1 :]])
    except BaseException:
        writer.abort()
        raise
    return writer.finish()


def _empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=schema)


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


def _verify(
    storage: Storage,
    path: str,
    partition: PartitionRef,
    expected: str,
    check: Callable[[], None],
) -> pa.Schema:
    """Hash the whole file against `expected` without holding it (before any of its rows is
    used), then read its schema from the footer."""
    digest = hashlib.blake2b(digest_size=16)
    try:
        with storage.open_input(path) as f:
            while chunk := f.read(COPY_CHUNK_BYTES):
                digest.update(chunk)
                check()
    except FileNotFoundError:
        raise PartitionMissing(partition, f"result partition file {path} is missing") from None
    except OSError as err:
        # Object stores report a missing key as a generic OSError.
        if not storage.exists(path):
            raise PartitionMissing(partition, f"result partition file {path} is missing") from None
        raise PartitionCorrupt(
            partition, f"result partition file {path} unreadable: {err}"
        ) from err
    actual = digest.hexdigest()
    if actual != expected:
        raise PartitionCorrupt(
            partition,
            f"result partition file {path} has checksum {actual}, expected {expected}",
        )
    with _opened(storage, path, partition) as reader:
        return reader.schema


@contextlib.contextmanager
def _opened(
    storage: Storage, path: str, partition: PartitionRef
) -> Iterator[pa.ipc.RecordBatchFileReader]:
    try:
        with storage.open_input(path) as f:
            yield pa.ipc.open_file(f)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as err:
        raise PartitionCorrupt(
            partition, f"result partition file {path} unreadable: {err}"
        ) from err


@dataclass(frozen=True)
class _InputFile:
    partition: PartitionRef
    path: str
    checksum: str


def subpartition_batches(
    storage: Storage,
    job_id: str,
    producer_vertex: str,
    attempts: dict[int, int],
    partition_range: tuple[int, int],
    subpartition_range: tuple[int, int],
    checksums: dict[tuple[int, int], str],
    check: Callable[[], None] = lambda: None,
) -> Iterator[tuple[pa.RecordBatch, int]]:
    """The record batches of subpartitions `subpartition_range` of producer subtasks
    `partition_range` (both inclusive) from their winning `attempts`, in (subtask,
    subpartition) order, each with the file bytes it accounts for (their sum is the bytes of
    the files). Every file is first verified against `checksums` (keyed by (producer subtask,
    subpartition)), all before the first batch: a corrupt partition is found before any user
    code sees its rows. Schemas that differ trivially between producers (a column all-null in
    one file is typed `null` there) are unified as `concat_tables` would. `check` is called
    while verifying (the cooperative cancellation check). Never holds a whole file: each file is
    read twice, once to hash it and once batch by batch (the second read comes from the page
    cache on a local disk)."""
    first_p, last_p = partition_range
    first_sp, last_sp = subpartition_range
    if first_p > last_p or first_sp > last_sp:
        raise ValueError(f"empty range: partitions {partition_range}, {subpartition_range}")
    files: list[_InputFile] = []
    for producer_subtask in range(first_p, last_p + 1):
        ref = PartitionRef(producer_vertex, producer_subtask, attempts[producer_subtask])
        for sp in range(first_sp, last_sp + 1):
            path = subpartition_path(storage, job_id, ref, sp)
            files.append(_InputFile(ref, path, checksums[(producer_subtask, sp)]))
    schemas = [_verify(storage, f.path, f.partition, f.checksum, check) for f in files]
    try:
        schema = pa.unify_schemas(schemas, promote_options="default")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise ValueError(
            f"the files of input {producer_vertex} do not share a schema: {err}"
        ) from None
    yielded = False
    for file in files:
        size = storage.size(file.path) or 0
        with _opened(storage, file.path, file.partition) as reader:
            count = reader.num_record_batches
            accounted = 0
            for i in range(count):
                # A file's batches have equal row counts but the last, so the file's bytes are
                # spread over them by index.
                upto = size * (i + 1) // count
                yielded = True
                yield _cast(reader.get_batch(i), schema, file), upto - accounted
                accounted = upto
            if accounted < size:
                # A file without rows (or its footer) still counts as read.
                yielded = True
                yield _empty_batch(schema), size - accounted
    if not yielded:
        yield _empty_batch(schema), 0


def _cast(batch: pa.RecordBatch, schema: pa.Schema, file: _InputFile) -> pa.RecordBatch:
    if batch.schema.equals(schema):
        return batch
    try:
        return batch.cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
        raise PartitionCorrupt(file.partition, f"result partition file {file.path}: {err}") from err


def read_subpartitions(
    storage: Storage,
    job_id: str,
    producer_vertex: str,
    attempts: dict[int, int],
    partition_range: tuple[int, int],
    subpartition_range: tuple[int, int],
    checksums: dict[tuple[int, int], str],
) -> tuple[pa.Table, int]:
    """`subpartition_batches` as one table, and the bytes read (for tools and tests)."""
    batches: list[pa.RecordBatch] = []
    read_bytes = 0
    for batch, nbytes in subpartition_batches(
        storage, job_id, producer_vertex, attempts, partition_range, subpartition_range, checksums
    ):
        batches.append(batch)
        read_bytes += nbytes
    return pa.Table.from_batches(batches), read_bytes


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
