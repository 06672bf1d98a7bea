"""What one attempt does inside a Spark task (a Python worker on the chosen host).

The driver pickles a `TaskSpec`; the task reads its inputs (splits, or subpartition ranges of the
winning producer attempts, checksum-verified), runs the user's function, and writes its output
(result partition files, or a staged sink file). It never raises: every failure comes back as an
`AttemptOutcome` with an error kind, because an exception crossing Spark's boundary arrives in
the driver as an opaque string.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from tailguard.agent.executor.exchange import hash_partition, round_robin_partition
from tailguard.agent.executor.partitions import (
    PartitionCorrupt,
    PartitionMissing,
    await_partition,
    read_subpartitions,
    write_partition,
)
from tailguard.agent.executor.sinks import SinkDef
from tailguard.agent.executor.sources import SourceDef, Split, read_splits
from tailguard.agent.executor.storage import Storage
from tailguard.model.records import Distribution, ErrorKind, InputRange, PartitionRef


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
    fn: Any = None  # the user function, or None for sources and sinks
    style: str = "arrow"
    source: SourceDef | None = None
    splits: tuple[Split, ...] = ()
    inputs: tuple[InputPlan, ...] = ()
    output: OutputPlan | None = None
    sink: SinkDef | None = None
    # Test hooks that exercise failure paths for real: fail this attempt with a USER error.
    fail_with: str | None = None


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
    staged: Any = None  # sink: what commit needs
    error: ErrorKind | None = None
    message: str = ""
    missing_partition: PartitionRef | None = None
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


def _call_user(spec: TaskSpec, tables: list[pa.Table]) -> pa.Table:
    if spec.style == "pandas":
        args: list[Any] = [t.to_pandas() for t in tables]
    else:
        args = list(tables)
    return _to_arrow(spec.fn(*args))


def _awaited_checksums(spec: TaskSpec, plan: InputPlan) -> dict[tuple[int, int], str]:
    """The plan's checksums completed from the markers of producers deployed with this attempt
    (waiting for each to finish writing)."""
    rng = plan.range
    checksums = dict(plan.checksums)
    for p in range(rng.partition_start, rng.partition_end + 1):
        if (p, rng.subpartition_start) in checksums:
            continue
        producer = PartitionRef(rng.input, p, plan.attempts[p])

        def abandon(producer: PartitionRef = producer) -> str | None:
            if spec.storage.exists(cancel_marker(spec)):
                return "this attempt was cancelled"
            producer_cancel = _cancel_path(
                spec.storage, spec.job_id, producer.vertex, producer.subtask, producer.attempt
            )
            if spec.storage.exists(producer_cancel):
                return "the producer attempt was cancelled"
            return None

        written = await_partition(spec.storage, spec.job_id, producer, PIPELINED_WAIT_S, abandon)
        for sp in range(rng.subpartition_start, rng.subpartition_end + 1):
            checksums[(p, sp)] = written.checksums[sp]
    return checksums


def _read_inputs(spec: TaskSpec) -> tuple[list[pa.Table], int]:
    tables: list[pa.Table] = []
    total_bytes = 0
    for plan in spec.inputs:
        checksums = _awaited_checksums(spec, plan) if plan.pipelined else plan.checksums
        table, read_bytes = read_subpartitions(
            spec.storage,
            spec.job_id,
            plan.range.input,
            plan.attempts,
            (plan.range.partition_start, plan.range.partition_end),
            (plan.range.subpartition_start, plan.range.subpartition_end),
            checksums,
        )
        tables.append(table)
        total_bytes += read_bytes
    return tables, total_bytes


def _split_output(table: pa.Table, output: OutputPlan, subtask: int) -> list[pa.Table]:
    if output.subpartitions <= 1:
        return [table]
    if output.distribution is Distribution.ALL_TO_ALL and output.keys:
        return hash_partition(table, output.keys, output.subpartitions)
    return round_robin_partition(table, output.subpartitions, offset=subtask)


def execute(spec: TaskSpec) -> AttemptOutcome:
    started = _now_ms()
    host = task_host()
    try:
        if spec.fail_with:
            raise RuntimeError(spec.fail_with)
        if spec.source is not None:
            table = read_splits(spec.source, list(spec.splits))
            input_bytes = sum(s.bytes for s in spec.splits)
        else:
            inputs, input_bytes = _read_inputs(spec)
            table = inputs[0] if spec.sink is not None else _call_user(spec, inputs)
        if spec.sink is not None:
            from tailguard.agent.executor.sinks import stage_sink_output

            staged = stage_sink_output(
                spec.storage, spec.job_id, spec.vertex, spec.subtask, spec.attempt, table
            )
            return AttemptOutcome(
                ok=True,
                host=host,
                started_at_ms=started,
                finished_at_ms=_now_ms(),
                input_bytes=input_bytes,
                records=table.num_rows,
                bytes_per_subpartition=(staged.bytes,),
                checksums=(staged.checksum,),
                staged=staged,
            )
        assert spec.output is not None, "a non-sink vertex needs an output plan"
        written = write_partition(
            spec.storage,
            spec.job_id,
            PartitionRef(spec.vertex, spec.subtask, spec.attempt),
            _split_output(table, spec.output, spec.subtask),
        )
        return AttemptOutcome(
            ok=True,
            host=host,
            started_at_ms=started,
            finished_at_ms=_now_ms(),
            input_bytes=input_bytes,
            records=written.records,
            bytes_per_subpartition=written.bytes_per_subpartition,
            checksums=written.checksums,
        )
    except PartitionMissing as err:
        return _failed(spec, host, started, ErrorKind.PARTITION_MISSING, str(err), err.partition)
    except PartitionCorrupt as err:
        return _failed(spec, host, started, ErrorKind.PARTITION_CORRUPT, str(err), err.partition)
    except Exception as err:  # user code: any error is the user's
        detail = "".join(traceback.format_exception_only(type(err), err)).strip()
        return _failed(spec, host, started, ErrorKind.USER, detail, None)


def _failed(
    spec: TaskSpec,
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


# ---------------------------------------------------------------------- cancellation
# Spark's cancellation ends the attempt's job on the driver at once, but the Python worker
# running the task is killed only by Spark's monitor thread, which polls every 2 s and then waits
# `spark.python.task.killTimeout` (2 s): measured 3.5 s, with the host's core busy all along. So
# the agent also drops a marker file on the job's storage (which every executor reaches) and the
# attempt ends its own worker when it sees it.
CANCEL_DIR = "cancel"
CANCEL_POLL_S = 0.05
CANCELED_EXIT_CODE = 75


def cancel_marker(spec: TaskSpec) -> str:
    return _cancel_path(spec.storage, spec.job_id, spec.vertex, spec.subtask, spec.attempt)


def _cancel_path(storage: Storage, job_id: str, vertex: str, subtask: int, attempt: int) -> str:
    return storage.path(job_id, CANCEL_DIR, vertex, subtask, attempt)


def request_cancel(spec: TaskSpec) -> None:
    """Tell the running attempt `spec` to stop (driver side; idempotent)."""
    spec.storage.write_atomic(cancel_marker(spec), b"")


class _CancelWatch:
    """Exits this Python worker when the attempt's cancel marker appears.

    Only used inside a Spark task (`run_attempt`): the worker process belongs to the attempt.
    The lock makes `stop` and the exit exclusive, so a reused worker never dies for an attempt
    that has already returned.
    """

    def __init__(self, spec: TaskSpec) -> None:
        self._storage = spec.storage
        self._marker = cancel_marker(spec)
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="tg-cancel-watch", daemon=True)

    def __enter__(self) -> _CancelWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._stopped.set()

    def _watch(self) -> None:
        while not self._stopped.wait(CANCEL_POLL_S):
            try:
                cancelled = self._storage.exists(self._marker)
            except OSError:
                continue  # storage hiccup: Spark's own kill still applies
            if cancelled:
                with self._lock:
                    if not self._stopped.is_set():
                        os._exit(CANCELED_EXIT_CODE)


def run_attempt(spec: TaskSpec) -> AttemptOutcome:
    """`execute` inside a Spark task, stoppable through `request_cancel`."""
    with _CancelWatch(spec):
        return execute(spec)


def run_pickled(payload: bytes) -> bytes:
    """Entry point used by the Spark runtime: pickled TaskSpec in, pickled outcome out."""
    from pyspark import cloudpickle

    spec: TaskSpec = cloudpickle.loads(payload)
    return cloudpickle.dumps(execute(spec))
