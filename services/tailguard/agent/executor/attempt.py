"""What one attempt of a chain does inside its slot runner.

The driver sends a `TaskSpec`; the attempt reads its inputs (source splits, or subpartition
ranges of the winning producer attempts, checksum-verified), runs the chain's operators one after
the other in this process with no result partition between them, and writes its output (result
partition files, or a staged sink file). It never raises: every failure comes back as an
`AttemptOutcome` with an error kind, which the driver turns into events.

Cancellation is cooperative: the attempt checks its `AttemptControl` after every split or
partition file it reads, between the chain's operators and before writing, and a user operator
can wait or loop through `control.wait` / `control.check_cancelled`.
"""

from __future__ import annotations

import os
import socket
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from tailguard.agent.executor.control import AttemptCancelled, AttemptControl, bind, unbind
from tailguard.agent.executor.exchange import hash_partition, round_robin_partition
from tailguard.agent.executor.partitions import (
    PartitionCorrupt,
    PartitionMissing,
    await_partition,
    read_subpartitions,
    write_partition,
)
from tailguard.agent.executor.sinks import SinkDef, StagedOutput, stage_sink_output
from tailguard.agent.executor.sources import SourceDef, Split, read_split
from tailguard.agent.executor.steps import OperatorStep
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

    range: InputRange
    distribution: Distribution
    # producer subtask -> winning attempt, or for a pipelined input the attempt deployed in the
    # same bulk
    attempts: dict[int, int]
    # (producer subtask, subpartition) -> checksum; a producer deployed in the same bulk has
    # none yet: its checksums come from its completion marker
    checksums: dict[tuple[int, int], str]
    pipelined: bool = False


# How long a pipelined consumer waits for a producer deployed with it. A producer that fails or
# is cancelled restarts the whole region (which cancels this consumer) long before; the deadline
# only bounds a wait nobody ends.
PIPELINED_WAIT_S = 3600.0


@dataclass(frozen=True)
class OutputPlan:
    """How to split the result for the consumers: one distribution for all of them."""

    distribution: Distribution
    keys: tuple[str, ...]
    subpartitions: int


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
    # Test hook that exercises failure paths for real: fail this attempt with a USER error.
    fail_with: str | None = None

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
    extra: dict[str, Any] = field(default_factory=dict)


def task_host() -> str:
    """The host this task runs on, as the cluster knows it."""
    return os.environ.get("SPARK_LOCAL_IP") or socket.gethostname()


def _now_ms() -> int:
    return int(time.time() * 1000)


def _to_arrow(value: Any) -> pa.Table:
    if isinstance(value, pa.Table):
        return value
    if isinstance(value, pa.RecordBatch):
        return pa.Table.from_batches([value])
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - pandas is a dependency
        pd = None
    if pd is not None and isinstance(value, pd.DataFrame):
        return pa.Table.from_pandas(value, preserve_index=False)
    raise TypeError(
        f"an operator must return a pyarrow.Table or a pandas.DataFrame, got {type(value).__name__}"
    )


def _call(step: OperatorStep, tables: list[pa.Table]) -> pa.Table:
    if step.style == "pandas":
        args: list[Any] = [t.to_pandas() for t in tables]
    else:
        args = list(tables)
    return _to_arrow(step.fn(*args))


def _awaited_checksums(
    spec: TaskSpec, plan: InputPlan, control: AttemptControl
) -> dict[tuple[int, int], str]:
    """The plan's checksums completed from the markers of producers deployed with this attempt
    (waiting for each to finish writing)."""
    rng = plan.range
    checksums = dict(plan.checksums)

    def abandon() -> str | None:
        # A producer that fails or is cancelled restarts the region, which cancels this attempt.
        return "this attempt was cancelled" if control.cancelled else None

    for p in range(rng.partition_start, rng.partition_end + 1):
        if (p, rng.subpartition_start) in checksums:
            continue
        producer = PartitionRef(rng.input, p, plan.attempts[p])
        written = await_partition(spec.storage, spec.job_id, producer, PIPELINED_WAIT_S, abandon)
        for sp in range(rng.subpartition_start, rng.subpartition_end + 1):
            checksums[(p, sp)] = written.checksums[sp]
    return checksums


def _on_read(control: AttemptControl) -> Any:
    def on_file(rows: int, nbytes: int) -> None:
        control.read(rows, nbytes)
        control.check()

    return on_file


def _read_inputs(spec: TaskSpec, control: AttemptControl) -> tuple[list[pa.Table], int]:
    tables: list[pa.Table] = []
    total_bytes = 0
    for plan in spec.inputs:
        checksums = _awaited_checksums(spec, plan, control) if plan.pipelined else plan.checksums
        table, read_bytes = read_subpartitions(
            spec.storage,
            spec.job_id,
            plan.range.input,
            plan.attempts,
            (plan.range.partition_start, plan.range.partition_end),
            (plan.range.subpartition_start, plan.range.subpartition_end),
            checksums,
            on_file=_on_read(control),
        )
        tables.append(table)
        total_bytes += read_bytes
    return tables, total_bytes


def _read_source(spec: TaskSpec, control: AttemptControl) -> tuple[list[pa.Table], int]:
    assert spec.source is not None
    tables: list[pa.Table] = []
    for split in spec.splits:
        table = read_split(spec.source, split)
        tables.append(table)
        control.read(table.num_rows, split.bytes)
        control.check()
    if not tables:
        return [pa.table({})], 0
    merged = pa.concat_tables(tables, promote_options="default")
    return [merged], sum(s.bytes for s in spec.splits)


def _run_chain(spec: TaskSpec, inputs: list[pa.Table], control: AttemptControl) -> pa.Table:
    """The chain's operators one after the other: the head gets every input (a join gets one
    table per input), each next operator the previous one's result."""
    if not spec.steps:
        if len(inputs) != 1:
            raise ValueError(f"{spec.vertex}: {len(inputs)} inputs but no operator to combine them")
        return inputs[0]
    tables = inputs
    for step in spec.steps:
        control.check()
        tables = [_call(step, tables)]
    return tables[0]


def _split_output(table: pa.Table, output: OutputPlan, subtask: int) -> list[pa.Table]:
    if output.subpartitions <= 1:
        return [table]
    if output.distribution is Distribution.ALL_TO_ALL and output.keys:
        return hash_partition(table, output.keys, output.subpartitions)
    return round_robin_partition(table, output.subpartitions, offset=subtask)


def execute(spec: TaskSpec, control: AttemptControl | None = None) -> AttemptOutcome:
    """Run one attempt to its end; `control` is how the runner cancels it."""
    control = control or AttemptControl(spec.input_bytes)
    token = bind(control)
    started = _now_ms()
    host = task_host()
    try:
        if spec.fail_with:
            raise RuntimeError(spec.fail_with)
        if spec.source is not None:
            inputs, input_bytes = _read_source(spec, control)
        else:
            inputs, input_bytes = _read_inputs(spec, control)
        table = _run_chain(spec, inputs, control)
        control.check()
        if spec.sink is not None:
            staged = stage_sink_output(
                spec.storage, spec.job_id, spec.vertex, spec.subtask, spec.attempt, table
            )
            return _succeeded(
                host, started, input_bytes, table.num_rows, (staged.bytes,), (staged.checksum,),
                staged,
            )
        assert spec.output is not None, "a chain without a sink needs an output plan"
        written = write_partition(
            spec.storage,
            spec.job_id,
            PartitionRef(spec.vertex, spec.subtask, spec.attempt),
            _split_output(table, spec.output, spec.subtask),
        )
        return _succeeded(
            host,
            started,
            input_bytes,
            written.records,
            written.bytes_per_subpartition,
            written.checksums,
        )
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
