"""Fakes for driving the agent's `JobDriver` without Spark or Kafka.

- `FakeRuntime` is the `Runtime` port: its slots "connect" when the driver starts it, every
  deploy and cancel is recorded (and handed to the test through queues), and the test answers
  for the runners by posting `FromRunner` messages, either with an outcome it makes up or by
  running the attempt for real in the test's thread (`run`).
- `SteppedInbox` is the driver's inbox with one addition: it notices when the driver's loop asks
  for its next message while the inbox is empty, which is the moment it has handled everything
  posted so far and scheduled what that allowed. `Harness.post` waits for that moment, so tests
  synchronise on the driver's own state, never on sleeps.
- `Harness` runs `JobDriver.run()` in a thread.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tailguard.agent.driver.driver import JobDriver, RunOptions
from tailguard.agent.driver.ports import (
    FromRunner,
    InboxMessage,
    Post,
    RunnerConnected,
)
from tailguard.agent.driver.result import RunResult
from tailguard.agent.executor.attempt import AttemptKey, AttemptOutcome, TaskSpec, execute
from tailguard.agent.executor.control import AttemptControl
from tailguard.agent.executor.partitions import completion_marker_path
from tailguard.agent.executor.protocol import AttemptEnded, AttemptProgressed, AttemptStarted
from tailguard.agent.executor.storage import Storage
from tailguard.agent.graph.api import Job
from tailguard.model import records as r
from tailguard.model.config import Settings

# Long enough never to fire during a test: no Tick, no local fallback unless services are off.
QUIET = {
    "slow-task-detector.check-interval": "1 h",
    "decider.timeout": "1 h",
    "failover.timeout": "1 h",
}
WAIT_S = 20.0


def write_parquet_input(path: Path, rows: int = 24, row_groups: int = 4) -> Path:
    """A Parquet file with `row_groups` row groups (= splits) of sales rows."""
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table(
        {
            "region": [f"r{k % 5}" for k in range(rows)],
            "amount": [float(k) for k in range(rows)],
        }
    )
    pq.write_table(table, path, row_group_size=max(1, rows // row_groups))
    return path


def ok_outcome(spec: TaskSpec, host: str = "h") -> AttemptOutcome:
    """A made-up successful outcome with as many subpartitions as the spec writes."""
    subpartitions = spec.output.subpartitions if spec.output is not None else 1
    return AttemptOutcome(
        ok=True,
        host=host,
        started_at_ms=0,
        finished_at_ms=1,
        bytes_per_subpartition=(1,) * subpartitions,
        checksums=tuple(f"{spec.key}-{sp}" for sp in range(subpartitions)),
    )


def failed_outcome(kind: r.ErrorKind = r.ErrorKind.USER, message: str = "boom") -> AttemptOutcome:
    return AttemptOutcome(
        ok=False, host="h", started_at_ms=0, finished_at_ms=1, error=kind, message=message
    )


def cancelled_outcome() -> AttemptOutcome:
    outcome = failed_outcome(r.ErrorKind.INFRA, "the attempt was cancelled")
    outcome.cancelled = True
    return outcome


# ------------------------------------------------------------------------------ the inbox


class SteppedInbox(queue.Queue[InboxMessage]):
    """A queue that counts the driver's idle moments (a blocking get on an empty queue)."""

    def __init__(self) -> None:
        super().__init__()
        self._idle = threading.Condition()
        self.idle_count = 0
        self.closed = False

    def get(self, block: bool = True, timeout: float | None = None) -> InboxMessage:
        if block:
            with self._idle:
                if self.empty():
                    self.idle_count += 1
                    self._idle.notify_all()
        return super().get(block, timeout)

    def mark(self) -> int:
        with self._idle:
            return self.idle_count

    def wait_idle_after(
        self, mark: int, busy: Callable[[], bool] = lambda: False, timeout: float = WAIT_S
    ) -> None:
        """Wait until the driver was idle after `mark` with nothing `busy` (storage work it
        handed off comes back as a message, and only then is the driver done with it)."""

        def settled() -> bool:
            return (self.idle_count > mark and not busy()) or self.closed

        with self._idle:
            done = self._idle.wait_for(settled, timeout)
        assert done, f"the driver did not become idle within {timeout} s"

    def close(self) -> None:
        with self._idle:
            self.closed = True
            self._idle.notify_all()


# ------------------------------------------------------------------------------ the ports


class ListPublisher:
    def __init__(self) -> None:
        self.events: list[r.Record] = []
        self.local_records: list[r.Record] = []
        self.closed_after: int | None = None

    def publish(self, record: r.Record) -> None:
        assert self.closed_after is None, f"published {record!r} after close"
        self.events.append(record)

    def local(self, record: r.Record) -> None:
        self.local_records.append(record)

    def close(self) -> None:
        self.closed_after = len(self.events)

    def of(self, cls: type[r.Event]) -> list[Any]:
        return [e for e in self.events if isinstance(e, cls)]


@dataclass
class Deployed:
    slot: str
    spec: TaskSpec

    @property
    def key(self) -> AttemptKey:
        return self.spec.key


@dataclass
class FakeRuntime:
    """`slots`: (host, slot id) in the order their runners connect."""

    slots: Sequence[tuple[str, str]]
    # Called on every deploy, on the driver's thread (raise to make deploy fail).
    on_deploy: Callable[[str, TaskSpec], None] | None = None
    post: Post | None = None
    job_id: str = ""
    deployed: list[Deployed] = field(default_factory=list)
    cancelled: list[tuple[str, AttemptKey]] = field(default_factory=list)
    # Notified on every deploy and when the driver ends (`Harness` sets `driver_ended`).
    changed: threading.Condition = field(default_factory=threading.Condition)
    driver_ended: bool = False
    # Attempts whose end the test has reported.
    answered: set[AttemptKey] = field(default_factory=set)
    ensure_calls: int = 0
    closed: bool = False

    @staticmethod
    def hosts(**hosts: int) -> FakeRuntime:
        return FakeRuntime([(h, f"{h}/s{k}") for h, n in hosts.items() for k in range(n)])

    # -- the port
    def start(self, job_id: str, post: Post) -> int:
        self.job_id, self.post = job_id, post
        for host, slot in self.slots:
            post(RunnerConnected(slot, host, sum(1 for h, _ in self.slots if h == host)))
        return len(self.slots)

    def ensure_runners(self) -> int:
        self.ensure_calls += 1
        return 0

    def executors(self) -> dict[str, int]:
        # Every runner connects at start: the executors' hosts are the runners' hosts.
        slots: dict[str, int] = {}
        for host, _ in self.slots:
            slots[host] = slots.get(host, 0) + 1
        return slots

    def deploy(self, slot: str, spec: TaskSpec) -> None:
        if self.on_deploy is not None:
            self.on_deploy(slot, spec)
        with self.changed:
            self.deployed.append(Deployed(slot, spec))
            self.changed.notify_all()

    def cancel(self, slot: str, key: AttemptKey) -> None:
        self.cancelled.append((slot, key))

    def close(self) -> None:
        self.closed = True

    # -- for the test
    def of(self, key: AttemptKey | tuple[str, int, int]) -> Deployed:
        key = AttemptKey(*key) if isinstance(key, tuple) else key
        found = [d for d in self.deployed if d.key == key]
        assert len(found) == 1, f"{key} deployed {len(found)} times"
        return found[0]

    def keys(self, since: int = 0) -> list[tuple[str, int, int]]:
        return [(d.key.vertex, d.key.subtask, d.key.attempt) for d in self.deployed[since:]]

    def wait_deployed(self, count: int, timeout: float = WAIT_S) -> bool:
        """Wait until `count` attempts were deployed (True) or the driver ended first (False)."""
        with self.changed:
            done = self.changed.wait_for(
                lambda: len(self.deployed) >= count or self.driver_ended, timeout
            )
            assert done, f"{count - len(self.deployed)} more deploys not seen within {timeout} s"
            return len(self.deployed) >= count

    def end_of_driver(self) -> None:
        with self.changed:
            self.driver_ended = True
            self.changed.notify_all()

    def report(self, slot: str, message: AttemptStarted | AttemptProgressed | AttemptEnded) -> None:
        assert self.post is not None
        self.post(FromRunner(slot, message, time.perf_counter()))

    def message_end(self, key: AttemptKey | tuple[str, int, int], outcome: AttemptOutcome) -> None:
        d = self.of(key)
        self.report(d.slot, AttemptEnded(d.key, outcome, 0.0))

    def execute(self, key: AttemptKey | tuple[str, int, int], cancel: bool = False) -> FromRunner:
        """Run the deployed attempt for real (here, in the caller's thread); the runner's
        report of its end, not yet posted."""
        d = self.of(key)
        control = AttemptControl(d.spec.input_bytes)
        if cancel:
            control.cancel()
        outcome = execute(d.spec, control)
        return FromRunner(d.slot, AttemptEnded(d.key, outcome, 0.0), time.perf_counter())


def partition_complete(spec: TaskSpec) -> list[str]:
    """Problems with the inputs of `spec`: blocking inputs must name complete partitions."""
    problems = []
    for plan in spec.inputs:
        if plan.pipelined:
            continue
        for p, attempt in plan.attempts.items():
            ref = r.PartitionRef(plan.ranges[0].input, p, attempt)
            if not spec.storage.exists(completion_marker_path(spec.storage, spec.job_id, ref)):
                problems.append(f"{spec.key} reads {ref}, which is not complete")
    return problems


# ------------------------------------------------------------------------------ the driver


class Harness:
    """A `JobDriver` running in a thread, with its fakes."""

    def __init__(
        self,
        job: Job,
        runtime: FakeRuntime,
        storage: Storage,
        *,
        services: bool = False,
        settings: dict[str, str] | None = None,
        job_id: str = "job",
    ) -> None:
        self.runtime = runtime
        self.publisher = ListPublisher()
        self.inbox = SteppedInbox()
        self.driver = JobDriver(
            job,
            runtime,
            self.publisher,
            Settings({**QUIET, **(settings or {})}),
            RunOptions(services=services, storage=storage, progress=False),
            job_id=job_id,
            inbox=self.inbox,
        )
        self._result: RunResult | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="test-driver", daemon=True)

    def _run(self) -> None:
        try:
            self._result = self.driver.run()
        except BaseException as err:  # reported by `result`
            self._error = err
        finally:
            self.inbox.close()
            self.runtime.end_of_driver()

    def start(self) -> Harness:
        mark = self.inbox.mark()
        self._thread.start()
        self.inbox.wait_idle_after(mark, self._storage_busy)
        return self

    def _storage_busy(self) -> bool:
        return self.driver.storage_busy

    def post(self, message: InboxMessage) -> None:
        """Post as a runner or the command consumer would, and wait until the driver has
        handled it and scheduled what it allows."""
        if isinstance(message, FromRunner) and isinstance(message.message, AttemptEnded):
            self.runtime.answered.add(message.message.key)
        mark = self.inbox.mark()
        self.inbox.put(message)
        self.inbox.wait_idle_after(mark, self._storage_busy)

    def command(self, command: r.Command) -> None:
        from tailguard.agent.driver.ports import CommandReceived

        self.post(CommandReceived(command))

    def end(self, key: tuple[str, int, int], outcome: AttemptOutcome) -> None:
        d = self.runtime.of(key)
        self.post(FromRunner(d.slot, AttemptEnded(d.key, outcome, 0.0), time.perf_counter()))

    def finish(self, key: tuple[str, int, int]) -> None:
        """The attempt ends well with a made-up outcome (no files)."""
        self.end(key, ok_outcome(self.runtime.of(key).spec))

    def run(self, key: tuple[str, int, int], cancel: bool = False) -> AttemptOutcome:
        """Run the attempt for real and report its end."""
        report = self.runtime.execute(key, cancel)
        self.post(report)
        assert isinstance(report.message, AttemptEnded)
        return report.message.outcome

    @property
    def finished(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout: float = WAIT_S) -> RunResult:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the driver did not end"
        if self._error is not None:
            raise AssertionError(f"JobDriver.run raised {self._error!r}") from self._error
        assert self._result is not None
        return self._result

    def stop(self) -> None:
        """End a driver the test has finished with (a FailJob through the inbox)."""
        if self._thread.is_alive():
            from tailguard.agent.driver.ports import CommandReceived

            self.inbox.put(
                CommandReceived(
                    r.FailJob(job_id=self.driver.job_id, ts=0, id="test-stop", reason="test over")
                )
            )
            self._thread.join(WAIT_S)


def run_all(h: Harness) -> RunResult:
    """Run every attempt the driver has deployed or deploys, for real and oldest first, until
    the job ends (an attempt the driver cancelled meanwhile ends cancelled)."""
    seen = 0
    while h.runtime.wait_deployed(seen + 1):
        d = h.runtime.deployed[seen]
        seen += 1
        if d.key in h.runtime.answered:
            continue
        cancelled = d.key in {k for _, k in h.runtime.cancelled}
        h.post(h.runtime.execute(d.key, cancel=cancelled))
    return h.result()


def one_subtask_job(tmp_path: Path) -> Harness:
    """One source subtask into a sink on host h1, the services on (so nothing falls back): the
    driver the command tests send their commands to. Not started."""
    job = Job("one")
    source = job.read_parquet(str(write_parquet_input(tmp_path / "in.parquet")), name="src")
    source.with_parallelism(1).write_parquet(str(tmp_path / "out"), name="out", parallelism=1)
    return Harness(job, FakeRuntime.hosts(h1=1), Storage(str(tmp_path / "st")), services=True)
