"""What one attempt of a chain does inside its slot runner.

The driver sends a `TaskSpec`; the attempt streams its inputs (source splits, subpartition
ranges of the winning producer attempts, checksum-verified, or the chains of a producer fused
into it: a broadcast join's other side) as record batches of the batch size
through the chain's operators, in this process with no result partition between them, and writes
its output (result partition files, or a staged sink file) as the batches arrive: it holds a few
batches per operator, not its input (docs/data-plane.md, "Streamed execution"). It never raises:
every failure comes back as an `AttemptOutcome` with an error kind, which the driver turns into
events.

Cancellation is cooperative: the attempt checks its `AttemptControl` after every batch it reads
and every batch an operator passes on, so a cancelled attempt stops within one batch; a user
operator can wait or loop through `control.wait` / `control.check_cancelled`. Progress (records
and bytes read) is counted per batch.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from tailguard.agent.executor.aggregation import LocalPhase, partial_states
from tailguard.agent.executor.batches import rebatch
from tailguard.agent.executor.control import AttemptCancelled, AttemptControl, bind, unbind
from tailguard.agent.executor.exchange import partition_batch
from tailguard.agent.executor.partitions import (
    PartitionCorrupt,
    PartitionInput,
    PartitionMissing,
    PartitionWriter,
    WrittenPartition,
    await_partition,
    input_batches,
)
from tailguard.agent.executor.sinks import SinkDef, StagedOutput, stage_sink_batches
from tailguard.agent.executor.sources import SourceDef, Split, split_batches
from tailguard.agent.executor.steps import OperatorStep, StepContext, run_chain
from tailguard.agent.executor.storage import Storage
from tailguard.model.records import Distribution, ErrorKind, InputRange, PartitionRef


@dataclass(frozen=True)
class AttemptKey:
    """One attempt of one subtask of one chain (Flink's ExecutionAttemptID)."""

    vertex: str
    subtask: int
    attempt: int

    def __str__(self) -> str:
        return f"{self.vertex}#{self.subtask} attempt {self.attempt}"


@dataclass(frozen=True)
class InputPlan:
    """How to read one input: its ranges plus the winners and checksums of its producers."""

    # Read in order as one stream: one range, or a POINTWISE consumer's run of
    # (partition, subpartition) slices, up to three (decider/policy/flink.py).
    ranges: tuple[InputRange, ...]
    distribution: Distribution
    # producer subtask -> winning attempt, or for a pipelined input the attempt deployed in the
    # same bulk
    attempts: dict[int, int]
    # (producer subtask, subpartition) -> checksum; a producer deployed in the same bulk has
    # none yet: its checksums come from its completion marker
    checksums: dict[tuple[int, int], str]
    pipelined: bool = False
    # A producer fused into this attempt (the other side of a broadcast join, decided before it
    # started): its subtasks' chains, one per partition of `ranges`, run here in order and
    # streamed into the input, so nothing of it is written to result partitions. Each has no
    # output plan and no sink; `attempts` and `checksums` are then empty.
    fused: tuple[TaskSpec, ...] = ()


# How long a pipelined consumer waits for a producer deployed with it. A producer that fails or
# is cancelled restarts the whole region (which cancels this consumer) long before; the deadline
# only bounds a wait nobody ends.
PIPELINED_WAIT_S = 3600.0

# Rows per record batch when a spec does not say (the `python.fn-execution.arrow.batch.size`
# setting's default, model/config.py).
DEFAULT_BATCH_ROWS = 10_000


@dataclass(frozen=True)
class OutputPlan:
    """How to split the result for the consumers: one distribution for all of them."""

    distribution: Distribution
    keys: tuple[str, ...]
    subpartitions: int
    # The consumers' aggregation's local phase, run before the split (None: rows as they are).
    local_phase: LocalPhase | None = None


@dataclass(frozen=True)
class TaskSpec:
    job_id: str
    storage: Storage
    vertex: str
    subtask: int
    attempt: int
    # The chain's operators with a function, head first (none for a source or sink alone).
    steps: tuple[OperatorStep, ...] = ()
    source: SourceDef | None = None
    splits: tuple[Split, ...] = ()
    inputs: tuple[InputPlan, ...] = ()
    output: OutputPlan | None = None
    sink: SinkDef | None = None
    # The bytes assigned to the attempt, for progress (None while a pipelined input's is unknown).
    input_bytes: int | None = None
    # Test hook that exercises failure paths for real: fail this attempt with a USER error once
    # its first input batch has gone through the chain (mid-stream: output may be half written).
    fail_with: str | None = None
    # Rows per record batch streamed through the chain.
    batch_rows: int = DEFAULT_BATCH_ROWS

    @property
    def key(self) -> AttemptKey:
        return AttemptKey(self.vertex, self.subtask, self.attempt)


@dataclass
class AttemptOutcome:
    ok: bool
    host: str
    started_at_ms: int
    finished_at_ms: int
    input_bytes: int | None = None
    records: int = 0
    bytes_per_subpartition: tuple[int, ...] = ()
    checksums: tuple[str, ...] = ()
    staged: StagedOutput | None = None  # sink: what commit needs
    error: ErrorKind | None = None
    message: str = ""
    missing_partition: PartitionRef | None = None
    # Ended because it was cancelled (the driver has already recorded why).
    cancelled: bool = False
    # The error recurs wherever the attempt runs (see `recurs_anywhere`).
    non_recoverable: bool = False
    # Bytes its operators wrote to local spill files (group assembly, a join's build side).
    spilled_bytes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def task_host() -> str:
    """The host this task runs on, as the cluster knows it."""
    return os.environ.get("SPARK_LOCAL_IP") or socket.gethostname()


def _now_ms() -> int:
    return int(time.time() * 1000)


def _awaited_checksums(
    spec: TaskSpec, plan: InputPlan, control: AttemptControl
) -> dict[tuple[int, int], str]:
    """The plan's checksums completed from the markers of producers deployed with this attempt
    (waiting for each to finish writing)."""
    checksums = dict(plan.checksums)

    def abandon() -> str | None:
        # A producer that fails or is cancelled restarts the region, which cancels this attempt.
        return "this attempt was cancelled" if control.cancelled else None

    for rng in plan.ranges:
        for p in range(rng.partition_start, rng.partition_end + 1):
            if (p, rng.subpartition_start) in checksums:
                continue
            producer = PartitionRef(rng.input, p, plan.attempts[p])
            written = await_partition(
                spec.storage, spec.job_id, producer, PIPELINED_WAIT_S, abandon
            )
            for sp in range(rng.subpartition_start, rng.subpartition_end + 1):
                checksums[(p, sp)] = written.checksums[sp]
    return checksums


def _counted(
    batches: Iterator[tuple[pa.RecordBatch, int]], control: AttemptControl
) -> Iterator[pa.RecordBatch]:
    """Per batch read: progress (records and bytes) and the cooperative cancellation check."""
    for batch, nbytes in batches:
        control.read(batch.num_rows, nbytes)
        control.check()
        yield batch


def _source_stream(spec: TaskSpec, control: AttemptControl) -> Iterator[pa.RecordBatch]:
    assert spec.source is not None
    for split in spec.splits:
        yield from _counted(split_batches(spec.source, split, spec.batch_rows), control)


def _input_stream(spec: TaskSpec, plan: InputPlan, chain: _Chain) -> Iterator[pa.RecordBatch]:
    if plan.fused:
        for producer in plan.fused:
            yield from _chain_stream(producer, chain)
        return
    control, opened = chain.control, chain.opened
    checksums = _awaited_checksums(spec, plan, control) if plan.pipelined else plan.checksums
    batches = input_batches(
        spec.storage, spec.job_id, plan.attempts, plan.ranges, checksums, check=control.check
    )
    opened.append(batches)
    yield from _counted(batches, control)


def _verified_at_end(
    stream: Iterator[pa.RecordBatch], opened: list[PartitionInput]
) -> Iterator[pa.RecordBatch]:
    """`stream`, then the rest of any partition file it stopped reading part-way verified
    (an operator may stop reading early): before the output is committed, since each file is
    verified in the pass that reads it (`PartitionInput`)."""
    yield from stream
    for partition_input in opened:
        partition_input.verify_read()


def _failing_after_first(
    stream: Iterator[pa.RecordBatch], message: str
) -> Iterator[pa.RecordBatch]:
    """The test hook `fail_with`: the first batch goes on, then the attempt fails."""
    for batch in stream:
        yield batch
        break
    raise RuntimeError(message)


def _write_partition(
    spec: TaskSpec, output: OutputPlan, stream: Iterator[pa.RecordBatch]
) -> WrittenPartition:
    """Split each batch for the consumers and write it into the subpartition files at once."""
    count = output.subpartitions
    keys = output.keys if output.distribution is Distribution.ALL_TO_ALL else ()
    writer = PartitionWriter(
        spec.storage,
        spec.job_id,
        PartitionRef(spec.vertex, spec.subtask, spec.attempt),
        count,
        spec.batch_rows,
    )
    split_rows = 0
    if output.local_phase is not None:
        stream = partial_states(stream, output.local_phase, spec.batch_rows)
    try:
        for batch in stream:
            writer.add(partition_batch(batch, count, keys, spec.subtask + split_rows))
            split_rows += batch.num_rows
    except BaseException:
        writer.abort()
        raise
    return writer.finish()


def execute(spec: TaskSpec, control: AttemptControl | None = None) -> AttemptOutcome:
    """Run one attempt to its end; `control` is how the runner cancels it."""
    control = control or AttemptControl(spec.input_bytes)
    token = bind(control)
    started = _now_ms()
    host = task_host()
    try:
        with tempfile.TemporaryDirectory(prefix="tailguard-attempt-") as spill_dir:
            return _run(spec, control, host, started, spill_dir)
    except AttemptCancelled as err:
        outcome = _failed(host, started, ErrorKind.INFRA, str(err), None)
        outcome.cancelled = True
        return outcome
    except PartitionMissing as err:
        if control.cancelled:  # a pipelined wait given up because of the cancellation
            outcome = _failed(host, started, ErrorKind.INFRA, str(err), None)
            outcome.cancelled = True
            return outcome
        return _failed(host, started, ErrorKind.PARTITION_MISSING, str(err), err.partition)
    except PartitionCorrupt as err:
        return _failed(host, started, ErrorKind.PARTITION_CORRUPT, str(err), err.partition)
    except Exception as err:  # user code: any error is the user's
        detail = "".join(traceback.format_exception_only(type(err), err)).strip()
        outcome = _failed(host, started, ErrorKind.USER, detail, None)
        outcome.non_recoverable = recurs_anywhere(err)
        return outcome
    finally:
        unbind(token)


def _run(
    spec: TaskSpec, control: AttemptControl, host: str, started: int, spill_dir: str
) -> AttemptOutcome:
    opened: list[PartitionInput] = []
    try:
        return _run_chain(spec, control, host, started, spill_dir, opened)
    except (AttemptCancelled, PartitionMissing, PartitionCorrupt):
        raise
    except Exception:
        # A corrupt partition file's rows may be what the code choked on: the mismatch, if
        # any, is the cause to report (PARTITION_CORRUPT restarts the producer).
        for partition_input in opened:
            partition_input.verify_read()
        raise


@dataclass
class _Chain:
    """What the chains run in one attempt share: its control, the partition files opened (to
    verify), and the steps' context (its spill directory and what was spilled)."""

    control: AttemptControl
    opened: list[PartitionInput]
    context: StepContext


def _chain_stream(spec: TaskSpec, chain: _Chain) -> Iterator[pa.RecordBatch]:
    """`spec`'s chain as one lazy stream: its inputs (source splits, partitions, or fused
    producers' chains) through its steps."""
    if spec.source is not None:
        inputs = [rebatch(_source_stream(spec, chain.control), spec.batch_rows)]
    else:
        inputs = [rebatch(_input_stream(spec, p, chain), spec.batch_rows) for p in spec.inputs]
    return run_chain(spec.steps, inputs, chain.context)


def _run_chain(
    spec: TaskSpec,
    control: AttemptControl,
    host: str,
    started: int,
    spill_dir: str,
    opened: list[PartitionInput],
) -> AttemptOutcome:
    context = StepContext(spec.batch_rows, spill_dir, control.check)
    output = _verified_at_end(_chain_stream(spec, _Chain(control, opened, context)), opened)
    if spec.fail_with:
        output = _failing_after_first(output, spec.fail_with)
    if spec.sink is not None:
        staged, rows = stage_sink_batches(
            spec.storage,
            spec.job_id,
            spec.vertex,
            spec.subtask,
            spec.attempt,
            output,
            spec.batch_rows,
        )
        control.check()
        outcome = _succeeded(
            host,
            started,
            _input_bytes(spec, control),
            rows,
            (staged.bytes,),
            (staged.checksum,),
            staged,
        )
    else:
        assert spec.output is not None, "a chain without a sink needs an output plan"
        written = _write_partition(spec, spec.output, output)
        outcome = _succeeded(
            host,
            started,
            _input_bytes(spec, control),
            written.records,
            written.bytes_per_subpartition,
            written.checksums,
        )
    outcome.spilled_bytes = context.spill.bytes
    return outcome


def _input_bytes(spec: TaskSpec, control: AttemptControl) -> int:
    """The bytes the attempt read: its splits' (compressed) sizes for a source, else the bytes
    its batches accounted for (partition files, and the splits of a fused producer's source)."""
    if spec.source is not None:
        return sum(s.bytes for s in spec.splits)
    return control.bytes_read


def recurs_anywhere(err: BaseException) -> bool:
    """Whether the error will recur wherever the attempt runs, so restarting it only uses up
    the restart strategy: an import error. Every executor runs the same environment (checked
    at job start, shipped with `spark.archives`), so a module missing on one is missing on
    all. Flink's counterpart: `ThrowableType.NonRecoverableError`."""
    return isinstance(err, ImportError)


def _succeeded(
    host: str,
    started: int,
    input_bytes: int,
    records: int,
    sizes: tuple[int, ...],
    checksums: tuple[str, ...],
    staged: StagedOutput | None = None,
) -> AttemptOutcome:
    return AttemptOutcome(
        ok=True,
        host=host,
        started_at_ms=started,
        finished_at_ms=_now_ms(),
        input_bytes=input_bytes,
        records=records,
        bytes_per_subpartition=sizes,
        checksums=checksums,
        staged=staged,
    )


def _failed(
    host: str,
    started: int,
    kind: ErrorKind,
    message: str,
    partition: PartitionRef | None,
) -> AttemptOutcome:
    return AttemptOutcome(
        ok=False,
        host=host,
        started_at_ms=started,
        finished_at_ms=_now_ms(),
        error=kind,
        message=message[:2000],
        missing_partition=partition,
    )
