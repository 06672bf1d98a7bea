"""The agent on a 3-worker standalone cluster: placement, speculation, cancellation, lost
partitions and command validation, with real Spark jobs on three distinct hosts.

The plugin's cluster (three 1-core workers on 127.0.0.2-4) and its SparkSession serve every
test (`tailguard_spark`, or `tailguard_harness.spark_of` in module fixtures); each job runs with
the services off, so every decision not posted by a test comes
from the agent's local fallbacks. Tests act mid-job through the runner's hooks: `on_start` hands
over the runner, `on_event` sees every event in the runner's own thread (before the runner takes
its next step), and `runner.post("command", ...)` delivers a command the way the command
consumer does.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tailguard.agent.driver.driver import JobDriver
from tailguard.agent.driver.hooks import JobHooks
from tailguard.agent.driver.ports import CommandReceived
from tailguard.agent.driver.result import RunResult
from tailguard.agent.executor import control, partitions
from tailguard.agent.graph.api import Job
from tailguard.examples import orders_by_segment, sales_by_region
from tailguard.model import records as r
from tailguard.model.ids import derived_id
from tailguard.processes import trees
from tailguard.testing import Harness
from tailguard.testing import run_job as run_on

WORKERS = 3
# Skipped with the reason where there is no JDK (tests/conftest.py).
pytestmark = [pytest.mark.spark, pytest.mark.tailguard_cluster(workers=WORKERS)]
POLICY = {
    "execution.batch.adaptive.auto-parallelism.avg-data-volume-per-task": "64 KiB",
    "execution.batch.adaptive.auto-parallelism.max-parallelism": "8",
    "restart-strategy.type": "fixed-delay",
    "restart-strategy.fixed-delay.delay": "100 ms",
    # Ticks drive the tests' own "detector" below; a short interval keeps the jobs short.
    "slow-task-detector.check-interval": "200 ms",
}
SLOW_S = 60.0  # how long the straggler would run if nobody cancelled it
HOLD_S = 6.0  # the speculation job's last stage: above a runner's cancel grace (5 s)
# `final` and the sink run as one chain.
SINK = "final→sink"


def poll(condition: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (result := condition()):
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return result


@dataclass
class Recorder:
    """Collects a run's events and, for each finished attempt, the host its task reported."""

    events: list[r.Event] = field(default_factory=list)
    reported_hosts: dict[tuple[str, int, int], str] = field(default_factory=dict)
    # The slot runner each attempt was deployed to.
    slots: dict[tuple[str, int, int], str] = field(default_factory=dict)
    runner: JobDriver | None = None
    # Extra reactions of a test, called after recording (in the runner's thread).
    reactions: list[Callable[[JobDriver, r.Event], None]] = field(default_factory=list)

    def on_start(self, runner: JobDriver) -> None:
        self.runner = runner

    def on_event(self, event: r.Event) -> None:
        self.events.append(event)
        if self.runner is None:
            return  # before on_start: JobSubmitted and the first NodeAdded events
        if isinstance(event, r.AttemptDeploying):
            subtask = self.runner.state.subtask(event.vertex, event.subtask)
            assert subtask is not None
            slot = subtask.attempts[event.attempt].slot
            assert slot is not None
            self.slots[(event.vertex, event.subtask, event.attempt)] = slot
        if isinstance(event, r.AttemptFinished):
            subtask = self.runner.state.subtask(event.vertex, event.subtask)
            assert subtask is not None
            outcome = subtask.attempts[event.attempt].outcome
            self.reported_hosts[(event.vertex, event.subtask, event.attempt)] = outcome.host
        for react in self.reactions:
            react(self.runner, event)

    def of(self, cls: type[Any]) -> list[Any]:
        return [e for e in self.events if isinstance(e, cls)]

    def deploying(self) -> dict[tuple[str, int, int], r.AttemptDeploying]:
        return {(e.vertex, e.subtask, e.attempt): e for e in self.of(r.AttemptDeploying)}


def run_job(job: Job, spark: Any, tmp: Path, recorder: Recorder) -> RunResult:
    """The job with the services off (the log in its archive), recorded by `recorder`; its
    operators go to the executors by value (the plugin's `run_job`)."""
    hooks = JobHooks(on_event=recorder.on_event, on_start=recorder.on_start)
    return run_on(job, spark, tmp, settings=POLICY, hooks=hooks).result


def command_fields(runner: JobDriver, name: str, ts: int) -> dict[str, Any]:
    return {"job_id": runner.job_id, "ts": ts, "id": derived_id("test", runner.job_id, name)}


def assert_exact_sales(out: Path, data: Path, result: RunResult) -> None:
    expected = sales_by_region.reference(data)
    actual = sales_by_region.read_output(out)
    assert actual[expected.columns.tolist()].equals(expected)
    # One file per sink subtask: no attempt published twice, no loser published at all.
    assert len(list(out.glob("part-*.parquet"))) == result.parallelism[SINK][0]
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith("part-")) == [
        "_SUCCESS",
        "_TAILGUARD_SINK",
    ]


def revenue_sums(table: pa.Table) -> pa.Table:
    """sales_by_region's score and partial sums in one operator."""
    return sales_by_region.partial_sums(sales_by_region.score(table))


def assert_ran_where_placed(recorder: Recorder) -> None:
    """Every finished attempt's task reported the host of its AttemptDeploying event."""
    deploying = recorder.deploying()
    finished = recorder.of(r.AttemptFinished)
    assert finished
    assert set(recorder.reported_hosts) == {(e.vertex, e.subtask, e.attempt) for e in finished}
    for key, reported in recorder.reported_hosts.items():
        assert reported == deploying[key].host, (key, reported, deploying[key].host)


def sales_job(
    data: Path,
    out: Path,
    partial: Callable[[pa.Table], pa.Table],
    final_parallelism: int | None = None,
    final: Callable[[pa.Table], pa.Table] = sales_by_region.final_sums,
) -> Job:
    """sales_by_region's shape with a fixed source parallelism of 3 (one subtask per host) and
    the given partial-sum and final operators; `final_parallelism` fixes the last stage's
    (None: decided from the data)."""
    job = Job("sales-on-cluster")
    sales = job.read_parquet(str(data), name="sales", parallelism=3)
    totals = sales.map(partial, name="partial").partition_by("region")
    fixed = {"parallelism": final_parallelism}  # on both, which then still run as one chain
    totals.map(final, name="final", **fixed).write_parquet(str(out), name="sink", **fixed)
    return job


# --------------------------------------------------------------------------- the examples


@dataclass
class ExampleRun:
    name: str
    result: RunResult
    recorder: Recorder
    matches_reference: bool


@pytest.fixture(scope="module")
def example_runs(
    tailguard_harness: Harness, request: pytest.FixtureRequest, tmp_path_factory: Any
) -> list[ExampleRun]:
    spark = tailguard_harness.spark_of(request.node)
    runs = []
    tmp = tmp_path_factory.mktemp("sales")
    data = sales_by_region.generate(tmp / "data", files=4, rows_per_file=3_000)
    recorder = Recorder()
    result = run_job(sales_by_region.make_job(data, tmp / "out"), spark, tmp, recorder)
    expected = sales_by_region.reference(data)
    actual = sales_by_region.read_output(tmp / "out") if result.ok else None
    same = actual is not None and actual[expected.columns.tolist()].equals(expected)
    runs.append(ExampleRun("sales_by_region", result, recorder, same))

    tmp = tmp_path_factory.mktemp("orders")
    orders, customers = orders_by_segment.generate(
        tmp / "data", customers=200, files=3, rows_per_file=2_000
    )
    recorder = Recorder()
    result = run_job(
        orders_by_segment.make_job(orders, customers, tmp / "out"), spark, tmp, recorder
    )
    expected = orders_by_segment.reference(orders, customers)
    actual = orders_by_segment.read_output(tmp / "out") if result.ok else None
    same = actual is not None and actual[expected.columns.tolist()].equals(expected)
    runs.append(ExampleRun("orders_by_segment", result, recorder, same))
    return runs


def test_examples_match_pandas_on_three_hosts(example_runs: list[ExampleRun]) -> None:
    for run in example_runs:
        assert run.result.ok, f"{run.name}: {run.result.summary()}"
        assert run.matches_reference, run.name
        assert not run.result.commands_rejected


def test_attempts_run_on_the_host_the_agent_chose(
    example_runs: list[ExampleRun], tailguard_cluster: Any
) -> None:
    hosts = tailguard_cluster.hosts()
    chosen: set[str] = set()
    for run in example_runs:
        assert_ran_where_placed(run.recorder)
        deployed = {e.host for e in run.recorder.deploying().values()}
        chosen |= deployed
        # Placement starts once the first runner connects: a job of millisecond attempts may
        # end before a slower host's runners join, so not every host need be added; every
        # host that got an attempt was.
        added = {e.host for e in run.recorder.of(r.NodeAdded)}
        assert deployed <= added <= set(hosts), (deployed, added)
    # These jobs' attempts take milliseconds, and placement starts at the first runner, so a
    # run may use one host only (seen in CI: every run on 127.0.0.2). Pinning to a host other
    # than the first is exercised below, where a copy must run on another host than its
    # original (test_speculative_copy_runs_elsewhere_and_the_first_finisher_wins); the pool's
    # spreading over free hosts is a unit test (test_agent_slots).
    assert chosen and chosen <= set(hosts), chosen


# --------------------------------------------------------------------------- speculation


def _holding_final(table: pa.Table) -> pa.Table:
    """final_sums, after holding its slot for HOLD_S (the speculation fixture's last stage)."""
    control.wait(HOLD_S)
    return sales_by_region.final_sums(table)


def straggler(marker: str) -> Callable[[pa.Table], pa.Table]:
    """revenue_sums, but the first attempt of the subtask holding order 0 stalls for SLOW_S.

    The first attempt to create `marker` records its worker's pid there and stalls in a
    cancellable wait (as an I/O-bound operator would); every later attempt (the speculative
    copy) finds the marker and runs at full speed.
    """

    def partial(table: pa.Table) -> pa.Table:
        if pc.min(table["order_id"]).as_py() == 0:
            try:
                fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass
            else:
                os.write(fd, str(os.getpid()).encode())
                os.close(fd)
                control.wait(SLOW_S)
        return revenue_sums(table)

    return partial


@dataclass
class SpeculationRun:
    recorder: Recorder
    data: Path
    out: Path
    result: RunResult | None = None
    command_id: str | None = None
    slow_subtask: int | None = None


@pytest.fixture(scope="module")
def speculation(
    tailguard_harness: Harness, request: pytest.FixtureRequest, tmp_path_factory: Any
) -> SpeculationRun:
    spark = tailguard_harness.spark_of(request.node)
    tmp = tmp_path_factory.mktemp("speculation")
    data = sales_by_region.generate(tmp / "data", files=3, rows_per_file=2_000)
    marker = tmp / "straggler.pid"
    recorder = Recorder()
    run = SpeculationRun(recorder, data, tmp / "out")

    def speculate(runner: JobDriver, event: r.Event) -> None:
        # The tests' detector: every other subtask of `partial` has finished while the
        # straggler still runs its operator (it has created the marker).
        if run.command_id is not None or not isinstance(event, (r.Tick, r.AttemptFinished)):
            return
        vertex = runner.state.vertices["partial"]
        unfinished = [s for s in vertex.subtasks if s.winner is None]
        if not vertex.initialized or len(unfinished) != 1 or not marker.exists():
            return
        slow = unfinished[0]
        fields = command_fields(runner, f"speculate-{slow.index}", event.ts)
        run.command_id, run.slow_subtask = fields["id"], slow.index
        runner.post(
            CommandReceived(
                r.LaunchSpeculativeAttempts(vertex="partial", subtask=slow.index, count=1, **fields)
            )
        )

    recorder.reactions += [speculate]
    # The last stage takes every slot (one per host), and each of its subtasks holds its slot
    # longer than a runner's cancel grace (5 s), by which the cancelled straggler's slot is
    # free at the latest: so its third subtask can start only on that slot, once the
    # straggler's runner has reported the attempt's end. (Without the hold, a subtask that
    # finished first on another host freed a slot before the straggler's did.)
    job = sales_job(
        data, run.out, straggler(str(marker)), final_parallelism=WORKERS, final=_holding_final
    )
    run.result = run_job(job, spark, tmp, recorder)
    return run


def test_speculative_copy_runs_elsewhere_and_the_first_finisher_wins(
    speculation: SpeculationRun,
) -> None:
    run, events = speculation, speculation.recorder
    assert run.result is not None and run.result.ok, run.result and run.result.summary()
    assert run.command_id is not None, "the straggler never showed up"
    applied = [e for e in events.of(r.CommandApplied) if e.command_id == run.command_id]
    assert [e.command_type for e in applied] == ["LaunchSpeculativeAttempts"]

    deploying = events.deploying()
    original = deploying[("partial", run.slow_subtask, 0)]
    copy = deploying[("partial", run.slow_subtask, 1)]
    assert not original.speculative
    assert copy.speculative and copy.command_id == run.command_id
    assert copy.host != original.host
    # The copy's task ran where the agent put it.
    assert events.reported_hosts[("partial", run.slow_subtask, 1)] == copy.host

    finished = [e for e in events.of(r.AttemptFinished) if e.vertex == "partial"]
    assert [e.attempt for e in finished if e.subtask == run.slow_subtask] == [1]
    canceled = [e for e in events.of(r.AttemptCanceled) if e.vertex == "partial"]
    assert [(e.subtask, e.attempt, e.reason) for e in canceled] == [
        (run.slow_subtask, 0, r.CancelReason.LOST_RACE)
    ]
    assert run.result.speculative_wins == 1
    assert_ran_where_placed(events)
    assert_exact_sales(run.out, run.data, run.result)


def test_cancelled_attempt_frees_its_slot_for_the_next_attempt(
    speculation: SpeculationRun,
) -> None:
    run = speculation
    assert run.result is not None and run.result.ok, run.result and run.result.summary()
    canceled = [e for e in run.recorder.of(r.AttemptCanceled) if e.vertex == "partial"]
    assert len(canceled) == 1
    key = (canceled[0].vertex, canceled[0].subtask, canceled[0].attempt)
    summary = next(a for a in run.result.attempts if (a.vertex, a.subtask, a.attempt) == key)
    assert summary.status == "CANCELED" and summary.cancel_reason == "LOST_RACE"
    # Cooperative: the straggler's wait ended, its runner lived on (no worker was ended) ...
    assert run.result.runners_lost == 0
    # ... and its runner reported the attempt's end, which frees the slot, at once.
    deployed_ts = run.recorder.deploying()[key].ts  # >= the driver's deployed_at
    freed_after_ms = deployed_ts + summary.duration_ms - canceled[0].ts
    print(f"cancelled attempt's slot free after {freed_after_ms} ms")
    # The goal (100 ms) is a benchmark figure; here only that it is the cooperative path,
    # far below the runner's cancel grace period (5 s).
    assert freed_after_ms < 2_000, freed_after_ms
    # The next attempt on that host's one slot: a subtask of the last stage, which needs every
    # slot, deployed there after the cancellation.
    host = run.recorder.deploying()[key].host
    following = [e for e in run.recorder.of(r.AttemptDeploying) if e.vertex == SINK]
    assert any(e.host == host and e.ts >= canceled[0].ts for e in following), following


# --------------------------------------------------------------------------- lost partitions


def test_missing_partition_fails_the_consumer_and_the_job_recovers(
    tailguard_spark: Any, tmp_path: Path
) -> None:
    data = sales_by_region.generate(tmp_path / "data", files=3, rows_per_file=2_000)
    out = tmp_path / "out"
    lost = r.PartitionRef("partial", 0, 0)
    deleted: list[str] = []

    def delete_when_finished(runner: JobDriver, event: r.Event) -> None:
        # In the runner's thread, before it schedules anything: no consumer has started yet.
        if isinstance(event, r.AttemptFinished) and (
            event.vertex,
            event.subtask,
            event.attempt,
        ) == (lost.vertex, lost.subtask, lost.attempt):
            directory = partitions.partition_dir(runner.storage, runner.job_id, lost)
            assert runner.storage.list_dir(directory), "the partition has no files"
            runner.storage.delete_dir(directory)
            deleted.append(directory)

    recorder = Recorder(reactions=[delete_when_finished])
    result = run_job(sales_job(data, out, revenue_sums), tailguard_spark, tmp_path, recorder)

    assert deleted
    assert result.ok, result.summary()
    failed = recorder.of(r.AttemptFailed)
    assert failed and all(e.vertex == SINK for e in failed)
    assert all(e.error is r.ErrorKind.PARTITION_MISSING for e in failed)
    assert all(e.missing_partition == lost for e in failed)
    assert all("partial" in e.message for e in failed)
    # The local failover fallback re-ran the producer, then the consumer.
    assert any("failover" in note for note in result.fallbacks)
    reran = [e for e in recorder.of(r.AttemptFinished) if (e.vertex, e.subtask) == ("partial", 0)]
    assert [e.attempt for e in reran] == [0, 1]
    assert_ran_where_placed(recorder)
    assert_exact_sales(out, data, result)


# --------------------------------------------------------------------------- invalid commands


def test_invalid_commands_are_rejected_and_the_job_succeeds(
    tailguard_spark: Any, tailguard_cluster: Any, tmp_path: Path
) -> None:
    hosts = tailguard_cluster.hosts()
    data = sales_by_region.generate(tmp_path / "data", files=3, rows_per_file=2_000)
    out = tmp_path / "out"
    expected_reasons: dict[str, str] = {}

    def post_invalid(runner: JobDriver, event: r.Event) -> None:
        # On the first deployment: `sales` is initialised and has a live attempt, `final` is not
        # initialised. The commands are queued before the attempt's outcome can arrive.
        if expected_reasons or not isinstance(event, r.AttemptDeploying):
            return
        live = (event.vertex, event.subtask)
        until = event.ts + 60_000
        commands: list[tuple[str, str, Callable[..., r.Command], dict[str, Any]]] = [
            ("set-unknown", "unknown vertex 'nope'", r.SetParallelism,
             {"vertex": "nope", "parallelism": 1, "subtask_inputs": ()}),
            ("set-initialised", "already initialised", r.SetParallelism,
             {"vertex": "sales", "parallelism": 2, "subtask_inputs": ()}),
            ("set-out-of-bounds", "outside bounds [1, 8]", r.SetParallelism,
             {"vertex": SINK, "parallelism": 9, "subtask_inputs": ()}),
            ("speculate-unknown-vertex", "unknown vertex 'nope'", r.LaunchSpeculativeAttempts,
             {"vertex": "nope", "subtask": 0, "count": 1}),
            ("speculate-unknown-subtask", "unknown subtask sales#7", r.LaunchSpeculativeAttempts,
             {"vertex": "sales", "subtask": 7, "count": 1}),
            ("speculate-uninitialised", "not initialised", r.LaunchSpeculativeAttempts,
             {"vertex": SINK, "subtask": 0, "count": 1}),
            ("speculate-too-many", "exceed max-concurrent-executions 2",
             r.LaunchSpeculativeAttempts, {"vertex": live[0], "subtask": live[1], "count": 2}),
            ("speculate-zero", "count must be at least 1", r.LaunchSpeculativeAttempts,
             {"vertex": live[0], "subtask": live[1], "count": 0}),
            ("block-too-many", "over blocklist.max-blocked-fraction", r.BlockNodes,
             {"hosts": tuple(hosts[:2]), "until_ts": until}),
            ("block-unknown", "unknown host(s) ['10.9.9.9']", r.BlockNodes,
             {"hosts": ("10.9.9.9",), "until_ts": until}),
            ("block-in-the-past", "is not after", r.BlockNodes,
             {"hosts": (hosts[0],), "until_ts": event.ts - 1}),
            ("unblock-unknown", "unknown host(s) ['10.9.9.9']", r.UnblockNodes,
             {"hosts": ("10.9.9.9",)}),
            ("restart-unknown-vertex", "unknown vertex 'nope'", r.RestartTasks,
             {"tasks": (r.TaskRef("nope", 0),), "reason": "test", "not_before_ts": 0}),
            ("restart-unknown-subtask", "unknown subtask sales#7", r.RestartTasks,
             {"tasks": (r.TaskRef("sales", 7),), "reason": "test", "not_before_ts": 0}),
            ("restart-nothing", "no tasks to restart", r.RestartTasks,
             {"tasks": (), "reason": "test", "not_before_ts": 0}),
        ]  # fmt: skip
        for name, reason, cls, fields in commands:
            command = cls(**fields, **command_fields(runner, name, event.ts))
            expected_reasons[command.id] = reason
            runner.post(CommandReceived(command))

    recorder = Recorder(reactions=[post_invalid])
    result = run_job(sales_job(data, out, revenue_sums), tailguard_spark, tmp_path, recorder)

    assert result.ok, result.summary()
    rejected = {e.command_id: e for e in recorder.of(r.CommandRejected)}
    assert set(rejected) == set(expected_reasons)
    for command_id, reason in expected_reasons.items():
        assert reason in rejected[command_id].reason, (command_id, rejected[command_id].reason)
    assert not {e.command_id for e in recorder.of(r.CommandApplied)} & set(expected_reasons)
    assert {cid for cid, _, _ in result.commands_rejected} == set(expected_reasons)
    # Nothing a rejected command asked for happened.
    assert not recorder.of(r.NodeBlocked)
    assert not any(e.speculative for e in recorder.of(r.AttemptDeploying))
    assert result.parallelism["sales"] == (3, "fixed")
    assert not recorder.of(r.AttemptCanceled) and not recorder.of(r.AttemptFailed)
    assert_ran_where_placed(recorder)
    assert_exact_sales(out, data, result)


# --------------------------------------------------------------------------- executor loss
# Last in the module: it kills one of the three workers for good (the harness replaces a
# broken cluster when a test asks for one next).


def test_killed_worker_mid_attempt_is_node_lost_and_the_job_finishes_exactly(
    tailguard_spark: Any, tailguard_cluster: Any, tmp_path: Path
) -> None:
    data = sales_by_region.generate(tmp_path / "data", files=3, rows_per_file=2_000)
    out = tmp_path / "out"
    marker = tmp_path / "straggler.pid"
    killed: list[str] = []

    def kill_its_worker(runner: JobDriver, event: r.Event) -> None:
        # Once the straggler waits on its host, kill that worker's whole process tree (the
        # Worker, its executor and the runner's Python worker), as a lost machine would.
        if killed or not isinstance(event, r.Tick | r.AttemptProgress) or not marker.exists():
            return
        live = [a for a in runner.state.live_attempts() if a.vertex == "partial"]
        if len(live) != 1:
            return
        host = live[0].host
        root = tailguard_cluster.worker(host).pid
        trees.signal_all([root, *trees.descendants(root)], signal.SIGKILL)
        killed.append(host)

    recorder = Recorder(reactions=[kill_its_worker])
    job = sales_job(data, out, straggler(str(marker)))
    result = run_job(job, tailguard_spark, tmp_path, recorder)

    assert killed, "the straggler never started"
    assert result.ok, result.summary()
    lost = [e for e in recorder.of(r.AttemptFailed) if e.error is r.ErrorKind.NODE_LOST]
    assert [(e.vertex, e.host) for e in lost] == [("partial", killed[0])]
    assert killed[0] in {e.host for e in recorder.of(r.NodeRemoved)}
    # The retry ran elsewhere and the output is exact.
    retried = [
        e
        for e in recorder.of(r.AttemptFinished)
        if (e.vertex, e.subtask) == (lost[0].vertex, lost[0].subtask)
    ]
    assert retried and retried[0].host != killed[0]
    assert result.runners_lost >= 1
    assert_exact_sales(out, data, result)
