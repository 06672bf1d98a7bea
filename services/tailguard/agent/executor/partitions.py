"""BLOCKING result partitions as files: one per subpartition (a schema header, then an Arrow IPC
stream compressed as one zstd stream), with a checksum.

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
uses to spare the consumers a restart. A consumer reads each file once, hashing it in the pass
that decodes it (`PartitionInput`).

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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass

import psutil
import pyarrow as pa
import pyarrow.ipc

from tailguard.agent.executor.batches import compact
from tailguard.agent.executor.storage import Storage
from tailguard.model.durations import seconds_text
from tailguard.model.records import InputRange, PartitionRef

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
# below it, the writer's per-batch Python work (compacting, one IPC message) outweighs the rows.
# Compression no longer sets this floor: a file is one zstd stream, not a batch of separately
# compressed buffers (1M rows into 128 files as 256-row batches: 166 ms as one stream, against
# 459-731 ms with per-buffer IPC compression, which is why the floor was 1,024 before).
MIN_FILE_BATCH_ROWS = 1024
# Bytes copied at a time when a local spool is uploaded or a file is hashed.
COPY_CHUNK_BYTES = 8 << 20


def file_batch_rows(batch_rows: int, subpartitions: int) -> int:
    """Rows per record batch in each of `subpartitions` files written together.

    A file's rows are cut into batches of exactly this many (the last shorter), whatever batches
    they arrived in: the bytes depend on the rows alone. The writer holds fewer than this many
    rows per subpartition waiting, so splitting the batch size among the subpartitions keeps
    what waits near one batch (`subpartitions` × `MIN_FILE_BATCH_ROWS` at most, for wide
    exchanges).
    """
    share = -(-batch_rows // max(1, subpartitions))
    return min(batch_rows, max(MIN_FILE_BATCH_ROWS, share))


class _HashingFile:
    """A file-like object for pyarrow that passes bytes through to a file it does not own,
    hashing and counting them (the checksum of what was written, or read)."""

    WRITABLE = False

    def __init__(self) -> None:
        self._hash = hashlib.blake2b(digest_size=16)
        self.size = 0
        self.closed = False

    def _passed(self, data: bytes | memoryview) -> None:
        self._hash.update(data)
        self.size += memoryview(data).nbytes

    def tell(self) -> int:
        return self.size

    def close(self) -> None:
        # The file underneath belongs to whoever opened it, who closes (or publishes) it.
        self.closed = True

    def writable(self) -> bool:
        return self.WRITABLE

    def readable(self) -> bool:
        return not self.WRITABLE

    def seekable(self) -> bool:
        return False

    @property
    def checksum(self) -> str:
        return self._hash.hexdigest()


class _HashingOutput(_HashingFile):
    """A sink for pyarrow's writers (the file is `atomic_output`'s)."""

    WRITABLE = True

    def __init__(self, out: pa.NativeFile) -> None:
        super().__init__()
        self._out = out

    def write(self, data: bytes | memoryview | pa.Buffer) -> int:
        view = memoryview(data)
        self._passed(view)
        self._out.write(view)
        return view.nbytes

    def flush(self) -> None:
        pass


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
    """One subpartition's file while it is written: rows wait (as zero-copy slices of the
    batches they came in) until a file batch is full.

    The file is the schema as an Arrow IPC message, then an Arrow IPC stream compressed as one
    zstd stream: the compressor keeps its context across batches, so small file batches cost
    little more to compress than large ones, and a reader can hash the bytes in the same
    sequential pass that decodes them."""

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
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None

    def add(self, batch: pa.RecordBatch) -> int:
        """Hold `batch` (no copy); returns the rows written out because a file batch filled."""
        if self.schema is None:
            self.schema = batch.schema
        if not batch.num_rows:
            return 0
        self.pending.append(batch)
        self.pending_rows += batch.num_rows
        written = 0
        while self.pending_rows >= self.batch_rows:
            written += self._write_first(self.batch_rows)
        return written

    def _write_first(self, rows: int) -> int:
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
        # Compacted, so a slice and a fresh batch of the same rows give the same bytes.
        self._open(schema).write_batch(compact(taken, schema))
        self.records += rows
        return rows

    def _open(self, schema: pa.Schema) -> pa.ipc.RecordBatchStreamWriter:
        if self._writer is None:
            self._sink = self._stack.enter_context(atomic_output(self.storage, self.path))
            # The schema also goes first, uncompressed, so a reader learns it without
            # decompressing anything (`PartitionInput` unifies the files' schemas up front).
            self._sink.write(schema.serialize())
            compressed = self._stack.enter_context(pa.CompressedOutputStream(self._sink, _CODEC))
            self._writer = pa.ipc.new_stream(compressed, schema)
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
    `abort` (leaves nothing behind).

    Pieces are held as they come, without a copy: the pieces of one batch are usually slices
    of one buffer (`exchange.partition_batch`: one sort by subpartition per batch), and copying
    each small piece cost more than writing it. A held slice keeps its whole parent batch
    alive, though, and a subpartition that gets few rows keeps old parents alive long after
    the others wrote theirs. So the writer counts what it keeps beyond the rows waiting (rows
    of parents already written out) and, once that exceeds both the batch size and the rows
    waiting, copies every waiting row into one fresh buffer (one concatenation per column)
    and drops the parents. Memory is thus bounded by rows, whatever the skew: the rows waiting
    (fewer than `file_batch_rows` per subpartition, so at most about max(batch size,
    subpartitions × MIN_FILE_BATCH_ROWS)) plus as many again plus one batch of parents. Each
    row is copied at most once per consolidation, and consolidations copy no more rows than
    arrived since the last one. The copy changes no byte written: file batches are cut at
    fixed row counts per subpartition and compacted when written."""

    def __init__(
        self,
        storage: Storage,
        job_id: str,
        partition: PartitionRef,
        subpartitions: int,
        batch_rows: int,
        file_rows: int | None = None,
    ) -> None:
        """`file_rows` overrides `file_batch_rows` (a writer given whole tables holds them
        anyway, and fewer, larger file batches write faster)."""
        if subpartitions < 1:
            raise ValueError(f"need at least one subpartition, got {subpartitions}")
        self.storage = storage
        self.job_id = job_id
        self.partition = partition
        self.batch_rows = batch_rows
        rows = file_rows or file_batch_rows(batch_rows, subpartitions)
        self._files = [
            _SubpartitionFile(storage, subpartition_path(storage, job_id, partition, sp), rows)
            for sp in range(subpartitions)
        ]
        self._waiting_rows = 0  # rows held in the files' pending lists
        self._kept_rows = 0  # rows of the batches those pending slices keep alive

    def add(self, pieces: list[pa.RecordBatch]) -> None:
        if len(pieces) != len(self._files):
            raise ValueError(f"{len(pieces)} pieces for {len(self._files)} subpartitions")
        for file, piece in zip(self._files, pieces, strict=True):
            rows = piece.num_rows
            if rows or file.schema is None:
                self._waiting_rows += rows - file.add(piece)
                self._kept_rows += rows
        kept_beyond = self._kept_rows - self._waiting_rows
        if kept_beyond > max(self.batch_rows, self._waiting_rows):
            self._consolidate()

    def _consolidate(self) -> None:
        """Copy every waiting row into one fresh batch and re-slice it per subpartition."""
        waiting = [s for f in self._files for s in f.pending]
        if not waiting:
            self._kept_rows = 0
            return
        merged = compact(waiting, waiting[0].schema)
        start = 0
        for file in self._files:
            file.pending = [merged.slice(start, file.pending_rows)] if file.pending_rows else []
            start += file.pending_rows
        self._kept_rows = self._waiting_rows = merged.num_rows

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


# Rows per file batch of `write_partition`: its tables are in memory already, so the file
# batches need not be small (as in the one-shot writer before streaming).
_TABLE_BATCH_ROWS = 64 * 1024


def write_partition(
    storage: Storage, job_id: str, partition: PartitionRef, tables: list[pa.Table]
) -> WrittenPartition:
    """Write `tables[i]` as subpartition i of `partition` (an empty table still gets a file,
    carrying the schema, so every consumer finds what it expects)."""
    writer = PartitionWriter(
        storage, job_id, partition, len(tables), _TABLE_BATCH_ROWS, file_rows=_TABLE_BATCH_ROWS
    )
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
                partition, f"{_name(partition)} not complete within {seconds_text(timeout_s)}"
            )
        time.sleep(poll_s)  # polling the shared storage: it has no change notification


def _name(partition: PartitionRef) -> str:
    return f"pipelined partition {partition.vertex}#{partition.subtask} attempt {partition.attempt}"


# ---------------------------------------------------------------------- reading


class _HashingInput(_HashingFile):
    """A source for pyarrow's readers, so the checksum is taken in the same pass that decodes
    the file (the file is the `_OpenFile`'s)."""

    def __init__(self, raw: pa.NativeFile) -> None:
        super().__init__()
        self._raw = raw

    def read(self, nbytes: int = -1) -> bytes:
        data: bytes = self._raw.read(nbytes if nbytes is not None and nbytes >= 0 else None)
        self._passed(data)
        return data

    def drain(self) -> None:
        """Hash what the decoder left unread (the end of the compressed stream)."""
        while self.read(COPY_CHUNK_BYTES):
            pass


@dataclass(frozen=True)
class _InputFile:
    partition: PartitionRef
    path: str
    checksum: str

    def missing(self) -> PartitionMissing:
        return PartitionMissing(self.partition, f"result partition file {self.path} is missing")

    def unreadable(self, err: Exception) -> PartitionCorrupt:
        return PartitionCorrupt(
            self.partition, f"result partition file {self.path} unreadable: {err}"
        )


class _OpenFile:
    """One partition file being read: decoded batch by batch while its bytes are hashed."""

    def __init__(self, storage: Storage, file: _InputFile) -> None:
        self.file = file
        try:
            # A sequential stream: on an object store one GET, not a ranged request per read.
            self._raw = storage.fs.open_input_stream(file.path)
        except FileNotFoundError:
            raise file.missing() from None
        except OSError as err:
            # Object stores report a missing key as a generic OSError.
            if not storage.exists(file.path):
                raise file.missing() from None
            raise file.unreadable(err) from err
        self._hashing = _HashingInput(self._raw)
        self._accounted = 0
        self._reader: pa.ipc.RecordBatchStreamReader | None = None
        try:
            self.schema = pa.ipc.read_schema(pa.PythonFile(self._hashing, mode="r"))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as err:
            raise self._failure(err) from err

    def next_batch(self) -> pa.RecordBatch | None:
        """The file's next batch, or None at its end (where the checksum has been verified)."""
        try:
            if self._reader is None:
                compressed = pa.CompressedInputStream(
                    pa.PythonFile(self._hashing, mode="r"), _CODEC
                )
                self._reader = pa.ipc.open_stream(compressed)
            return self._reader.read_next_batch()
        except StopIteration:
            pass
        except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as err:
            raise self._failure(err) from err
        self.verify()
        return None

    def bytes_since_last(self) -> int:
        """File bytes read since the last call (the progress a batch accounts for)."""
        taken = self._hashing.size - self._accounted
        self._accounted = self._hashing.size
        return taken

    def verify(self) -> None:
        """Hash the rest of the file and compare: PartitionCorrupt on a mismatch."""
        try:
            self._hashing.drain()
        except OSError as err:
            raise self.file.unreadable(err) from err
        finally:
            self._raw.close()
        actual = self._hashing.checksum
        if actual != self.file.checksum:
            raise PartitionCorrupt(
                self.file.partition,
                f"result partition file {self.file.path} has checksum {actual}, "
                f"expected {self.file.checksum}",
            )

    def _failure(self, err: Exception) -> PartitionError:
        """A file that cannot be decoded: a checksum mismatch says more, when there is one."""
        try:
            self.verify()
        except PartitionError as mismatch:
            return mismatch
        return self.file.unreadable(err)

    def close(self) -> None:
        self._raw.close()


class PartitionInput:
    """The record batches of an input's ranges of subpartitions (`input_batches`), each with the
    file bytes it accounts for, read in one pass per file: every file is hashed while it is
    decoded and compared with its checksum when its last batch has been read.

    So the rows of a corrupt file can reach the consumer's code before the mismatch is found.
    What keeps that safe is where the check sits: a file's mismatch raises PartitionCorrupt
    from this stream, which fails the attempt, and an attempt commits its output (a
    partition's completion marker, a sink part handed to the agent) only after its input
    streams have ended. A consumer that stops reading early, or that fails part-way, calls
    `verify_read` first: it hashes the rest of the file being read (files not yet opened gave
    no rows), so a corrupt file is still found, and named as the cause rather than whatever
    code choked on its rows."""

    def __init__(
        self, storage: Storage, files: list[_InputFile], check: Callable[[], None]
    ) -> None:
        self._storage = storage
        self._files = files
        self._check = check
        self._open: _OpenFile | None = None
        self._stream = self._batches()

    def __iter__(self) -> Iterator[tuple[pa.RecordBatch, int]]:
        return self

    def __next__(self) -> tuple[pa.RecordBatch, int]:
        return next(self._stream)

    def verify_read(self) -> None:
        """Verify the file being read, if any (see the class docstring)."""
        opened, self._open = self._open, None
        if opened is not None:
            opened.verify()

    def _batches(self) -> Iterator[tuple[pa.RecordBatch, int]]:
        schema = self._schema()
        yielded = False
        for file in self._files:
            self._check()
            opened = self._open = _OpenFile(self._storage, file)
            try:
                while (batch := opened.next_batch()) is not None:
                    yielded = True
                    yield _cast(batch, schema, file), opened.bytes_since_last()
            except BaseException:
                opened.close()
                self._open = None
                raise
            self._open = None
            rest = opened.bytes_since_last()
            if rest or not yielded:
                # The end of the stream (or a file without rows) still counts as read.
                yielded = True
                yield _empty_batch(schema), rest
        if not yielded:
            yield _empty_batch(schema), 0

    def _schema(self) -> pa.Schema:
        """One schema for every file, known before the first batch: schemas that differ
        trivially between producers (a column all-null in one file is typed `null` there) are
        unified as `concat_tables` would. Each file starts with its schema, uncompressed, so
        this reads the head of each file (a few hundred bytes, not the file)."""
        schemas: list[pa.Schema] = []
        for file in self._files:
            self._check()
            head = _OpenFile(self._storage, file)
            try:
                schemas.append(head.schema)
            finally:
                head.close()
        try:
            return pa.unify_schemas(schemas, promote_options="default")
        except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
            vertex = self._files[0].partition.vertex
            raise ValueError(f"the files of input {vertex} do not share a schema: {err}") from None


def input_batches(
    storage: Storage,
    job_id: str,
    attempts: dict[int, int],
    ranges: Sequence[InputRange],
    checksums: dict[tuple[int, int], str],
    check: Callable[[], None] = lambda: None,
) -> PartitionInput:
    """The record batches of `ranges` of one input (a POINTWISE consumer's run may have several)
    from the producers' winning `attempts`, range by range and within a range in (subtask,
    subpartition) order, each with the file bytes it accounts for (their sum is the bytes of the
    files), as one stream with one schema. Every file is verified against `checksums` (keyed by
    (producer subtask, subpartition)) in the same pass that reads it (`PartitionInput`).
    `check` is called per file (the cooperative cancellation check; the caller checks per
    batch). Never holds a whole file."""
    files: list[_InputFile] = []
    for rng in ranges:
        if rng.partition_start > rng.partition_end or rng.subpartition_start > rng.subpartition_end:
            raise ValueError(f"empty range: {rng}")
        for producer_subtask in range(rng.partition_start, rng.partition_end + 1):
            ref = PartitionRef(rng.input, producer_subtask, attempts[producer_subtask])
            for sp in range(rng.subpartition_start, rng.subpartition_end + 1):
                path = subpartition_path(storage, job_id, ref, sp)
                files.append(_InputFile(ref, path, checksums[(producer_subtask, sp)]))
    return PartitionInput(storage, files, check)


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
    """Subpartitions `subpartition_range` of producer subtasks `partition_range` (both
    inclusive) as one table (`input_batches`), and the bytes read (for tools and tests)."""
    rng = InputRange(producer_vertex, *partition_range, *subpartition_range)
    batches: list[pa.RecordBatch] = []
    read_bytes = 0
    for batch, nbytes in input_batches(storage, job_id, attempts, [rng], checksums):
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


def local_owner_alive(owner: JobOwner, hostname: str | None = None) -> bool:
    """Liveness as far as this machine can tell: an owner on another host counts as alive
    (its files are not ours to judge); a local pid that no longer exists, or that was reused
    by a process started after the job, counts as dead."""
    if owner.host != (hostname or socket.gethostname()):
        return True
    try:
        started_ms = psutil.Process(owner.pid).create_time() * 1000
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # not ours to look at: alive as far as we can tell
        return True
    # Slack for clock-tick rounding: the job's marker is written after its process starts.
    return started_ms <= owner.started_ms + 1000
