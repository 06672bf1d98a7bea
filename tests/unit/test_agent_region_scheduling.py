"""The runner's scheduling of pipelined regions, driven step by step with a recording runtime
(no Spark): bulk placement on free slots only, producers first, FIFO between regions, and a
region restart re-requested as one bulk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tailguard.agent.driver.driver import JobRunner, Publisher, RunOptions, Runtime
from tailguard.agent.executor.attempt import AttemptOutcome, TaskSpec
from tailguard.agent.executor.sources import Split
from tailguard.agent.executor.storage import Storage
from tailguard.agent.graph.api import Job
from tailguard.model import records as r
from tailguard.model.config import Settings

Key = tuple[str, int, int]


class RecordingRuntime(Runtime):
    def __init__(self) -> None:
        self.submitted: list[tuple[Key, TaskSpec]] = []
        self.cancelled: list[Key] = []

    def executors(self) -> dict[str, int]:
        return {"h": 2}

    def submit(self, key: Key, host: str, payload: Any, done: Any) -> None:
        self.submitted.append((key, payload))

    def cancel(self, key: Key) -> None:
        self.cancelled.append(key)


class ListPublisher(Publisher):
    def __init__(self) -> None:
        self.events: list[r.Record] = []

    def publish(self, record: r.Record) -> None:
        self.events.append(record)

    def local(self, record: r.Record) -> None:
        self.events.append(record)


def ident(t: Any) -> Any:
    return t


def make_runner(tmp_path: Path) -> tuple[JobRunner, RecordingRuntime, ListPublisher]:
    """sales (2, blocking) -> score (2) -pipelined-> partial (2) -> final (1) -> sink (1):
    regions {score#k, partial#k} of 2 tasks on a host with 2 slots."""
    job = Job("regions")
    sales = job.read_parquet("unused", name="sales", parallelism=2)
    score = sales.map(ident, name="score", parallelism=2)
    partial = score.pipelined().map(ident, name="partial", parallelism=2)
    final = partial.partition_by("k").map(ident, name="final", parallelism=1)
    final.write_parquet(str(tmp_path / "out"), name="sink", parallelism=1)
    runtime, publisher = RecordingRuntime(), ListPublisher()
    runner = JobRunner(
        job,
        runtime,
        publisher,
        Settings(
            {"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.delay": "0 ms"}
        ),
        RunOptions(services=False, storage=Storage(str(tmp_path / "storage")), progress=False),
        job_id="job",
    )
    runner.splits["sales"] = [Split(f"s{k}", None, 10) for k in range(2)]
    runner.emit(r.JobSubmitted, name=job.name, graph=job.spec({"sales": (10, 10)}), config={})
    runner._refresh_nodes()
    runner._initialize_static()
    return runner, runtime, publisher


def finish(runner: JobRunner, key: Key) -> None:
    attempt = runner._attempt(key)
    assert attempt is not None
    subpartitions = runner.state.vertices[key[0]].subpartitions
    runner._attempt_ended(
        attempt,
        AttemptOutcome(
            ok=True,
            host="h",
            started_at_ms=0,
            finished_at_ms=1,
            bytes_per_subpartition=(1,) * subpartitions,
            checksums=tuple(f"{key}-{sp}" for sp in range(subpartitions)),
        ),
    )


def step(runner: JobRunner, runtime: RecordingRuntime) -> list[Key]:
    """One scheduling round; the attempts it deployed."""
    before = len(runtime.submitted)
    runner._apply_due_fallbacks()
    runner._schedule()
    return [key for key, _ in runtime.submitted[before:]]


def test_regions_are_placed_whole_on_free_slots_oldest_first(tmp_path: Path) -> None:
    runner, runtime, publisher = make_runner(tmp_path)
    assert step(runner, runtime) == [("sales", 0, 0), ("sales", 1, 0)]
    finish(runner, ("sales", 0, 0))
    # Region {score#0, partial#0} is ready but only one slot is free: nothing runs half of it.
    assert step(runner, runtime) == []
    assert [q.key for q in runner.pool.pending()] == [("region", "score", 0)]
    finish(runner, ("sales", 1, 0))
    assert step(runner, runtime) == [("score", 0, 0), ("partial", 0, 0)]
    finish(runner, ("score", 0, 0))
    assert step(runner, runtime) == []  # region 1 still needs 2 slots
    finish(runner, ("partial", 0, 0))
    assert step(runner, runtime) == [("score", 1, 0), ("partial", 1, 0)]

    # The consumer names the producer attempt deployed with it and awaits its checksums.
    specs = dict(runtime.submitted)
    (plan,) = specs[("partial", 1, 0)].inputs
    assert plan.pipelined and plan.attempts == {1: 0} and plan.checksums == {}
    deploying = [e for e in publisher.events if isinstance(e, r.AttemptDeploying)]
    assert [(e.vertex, e.subtask) for e in deploying][-2:] == [("score", 1), ("partial", 1)]


def test_a_failure_in_a_region_restarts_it_as_one_bulk(tmp_path: Path) -> None:
    runner, runtime, publisher = make_runner(tmp_path)
    step(runner, runtime)
    finish(runner, ("sales", 0, 0))
    finish(runner, ("sales", 1, 0))
    assert step(runner, runtime) == [("score", 0, 0), ("partial", 0, 0)]
    finish(runner, ("score", 0, 0))
    partial = runner._attempt(("partial", 0, 0))
    assert partial is not None
    runner._attempt_ended(
        partial,
        AttemptOutcome(
            ok=False,
            host="h",
            started_at_ms=0,
            finished_at_ms=1,
            error=r.ErrorKind.USER,
            message="boom",
        ),
    )
    # The local failover (services off) restarts the region, the finished producer too; the
    # region is requested again as one bulk, behind region 1, which asked first.
    assert step(runner, runtime) == [("score", 1, 0), ("partial", 1, 0)]
    restarts = [e for e in publisher.events if isinstance(e, r.CommandApplied)]
    assert [c.command_type for c in restarts] == ["RestartTasks"]
    assert runner.state.subtask("score", 0).winner is None  # type: ignore[union-attr]
    assert [q.tasks for q in runner.pool.pending()] == [[("score", 0), ("partial", 0)]]
    finish(runner, ("score", 1, 0))
    finish(runner, ("partial", 1, 0))
    assert step(runner, runtime) == [("score", 0, 1), ("partial", 0, 1)]


def test_a_failed_producer_cancels_its_live_consumer_and_the_region_waits_for_its_slot(
    tmp_path: Path,
) -> None:
    runner, runtime, _ = make_runner(tmp_path)
    step(runner, runtime)
    finish(runner, ("sales", 0, 0))
    finish(runner, ("sales", 1, 0))
    assert step(runner, runtime) == [("score", 0, 0), ("partial", 0, 0)]
    score = runner._attempt(("score", 0, 0))
    assert score is not None
    runner._attempt_ended(
        score,
        AttemptOutcome(
            ok=False, host="h", started_at_ms=0, finished_at_ms=1, error=r.ErrorKind.USER
        ),
    )
    # The restart cancels the consumer still waiting for its producer; its slot comes back only
    # when its attempt ends, so no region (region 1 asked first) can be placed whole yet.
    assert step(runner, runtime) == []
    assert runtime.cancelled == [("partial", 0, 0)]
    canceled = runner._attempt(("partial", 0, 0))
    assert canceled is not None
    runner._attempt_ended(
        canceled, AttemptOutcome(ok=False, host="h", started_at_ms=0, finished_at_ms=1)
    )
    assert step(runner, runtime) == [("score", 1, 0), ("partial", 1, 0)]
