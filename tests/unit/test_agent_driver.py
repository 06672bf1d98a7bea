"""The driver with a fake runtime (no Spark). Attempts are run for real, in the test's thread,
where a test needs real partitions and sink files; elsewhere they are answered with made-up
outcomes.

Covers issue 9's crash in pure form, internal errors, lost runners, slot reuse after a
cancellation, progress reports, and chains running as one attempt per subtask."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from agent_fakes import (
    QUIET,
    FakeRuntime,
    Harness,
    ok_outcome,
    partition_complete,
    run_all,
    write_parquet_input,
)

from tailguard.agent.driver.ports import FromRunner, Post, RunnerLost
from tailguard.agent.executor.attempt import AttemptKey, TaskSpec
from tailguard.agent.executor.partitions import release_partition
from tailguard.agent.executor.protocol import AttemptEnded, AttemptProgressed, AttemptStarted
from tailguard.agent.executor.storage import Storage
from tailguard.agent.graph.api import Job
from tailguard.model import records as r

P = "sales→score→partial"  # the producer chain
F = "final→out"  # the consumer chain
FAST_RESTART = {"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.delay": "0"}
SMALL = {"execution.batch.adaptive.auto-parallelism.max-parallelism": "12"}
# For tests with the services on but no decider running: a fixed vertex waits for the decider's
# byte-balanced ranges (plans.static_subtask_inputs), so the local decision applies at once.
NO_DECIDER = {**SMALL, "decider.timeout": "0 ms"}


def score(t: pa.Table) -> pa.Table:
    return t.append_column("score", pc.multiply(t["amount"], 2))


def partial(t: pa.Table) -> pa.Table:
    return t.group_by("region").aggregate([("score", "sum")])


def final(t: pa.Table) -> pa.Table:
    totals = t.group_by("region").aggregate([("score_sum", "sum")])
    return totals.rename_columns(["region", "total"])


def sales_job(tmp_path: Path, final_parallelism: int = 12) -> Job:
    """sales → score → partial (2 subtasks, one chain) =partition_by(region)=> final → out."""
    write_parquet_input(tmp_path / "in" / "sales.parquet")
    job = Job("sales")
    partials = (
        job.read_parquet(str(tmp_path / "in"), name="sales", parallelism=2)
        .map(score, name="score", parallelism=2)
        .map(partial, name="partial", parallelism=2)
    )
    totals = partials.partition_by("region").map(final, name="final", parallelism=final_parallelism)
    totals.write_parquet(str(tmp_path / "out"), name="out", parallelism=final_parallelism)
    return job


def expected_totals(tmp_path: Path) -> dict[str, float]:
    table = pq.read_table(tmp_path / "in" / "sales.parquet")
    out: dict[str, float] = {}
    for region, amount in zip(
        table["region"].to_pylist(), table["amount"].to_pylist(), strict=True
    ):
        out[region] = out.get(region, 0.0) + 2 * amount
    return out


def output_totals(tmp_path: Path) -> dict[str, float]:
    table = pq.read_table(tmp_path / "out")
    regions = table["region"].to_pylist()
    assert len(regions) == len(set(regions)), "a region in two output files"
    return dict(zip(regions, table["total"].to_pylist(), strict=True))


def one_task_job(tmp_path: Path, parallelism: int = 1) -> Job:
    """src → out, one chain."""
    job = Job("one")
    source = job.read_parquet(str(write_parquet_input(tmp_path / "in.parquet")), name="src")
    source.with_parallelism(parallelism).write_parquet(
        str(tmp_path / "out"), name="out", parallelism=parallelism
    )
    return job


def events_of(h: Harness, cls: type[r.Event], since: int = 0) -> list:
    return [e for e in h.publisher.events[since:] if isinstance(e, cls)]


def restart(job_id: str, cid: str, *tasks: tuple[str, int]) -> r.RestartTasks:
    return r.RestartTasks(
        job_id=job_id,
        ts=int(time.time() * 1000),
        id=cid,
        tasks=tuple(r.TaskRef(v, k) for v, k in tasks),
        reason="partition missing",
        not_before_ts=0,
    )


class InputsReady:
    """The fake runtime's check on every deploy (on the driver's thread): each partition a
    consumer reads is its producer's current winner, readable, complete on storage, and not
    being re-produced."""

    def __init__(self, h: Harness) -> None:
        self.h = h
        self.problems: list[str] = []
        self.checked = 0

    def __call__(self, slot: str, spec: TaskSpec) -> None:
        self.checked += 1
        state = self.h.driver.state
        problems = partition_complete(spec)
        for plan in spec.inputs:
            producer = state.vertices[plan.ranges[0].input]
            for p, number in plan.attempts.items():
                sub = producer.subtasks[p]
                if sub.winner is None or sub.winner.number != number or not sub.available:
                    problems.append(f"{spec.key} reads {plan.ranges[0].input}#{p} attempt {number}")
                if sub.wanted or sub.live_attempts():
                    problems.append(f"{spec.key} deployed while {plan.ranges[0].input}#{p} re-runs")
        self.problems += problems
        assert not problems, problems


# ------------------------------------------------------------------------------ issue 9


def test_a_consumer_waits_while_its_input_is_re_produced_and_the_job_finishes(
    tmp_path: Path,
) -> None:
    """Issue 9: a deleted partial#0 partition; the failover service restarts partial#0 and
    final#0 while other final subtasks are queued for slots. No final subtask may be deployed
    until partial#0 is produced again, and the job ends with the exact output."""
    runtime = FakeRuntime.hosts(h1=1, h2=1, h3=1)
    settings = {**NO_DECIDER, "slow-task-detector.check-interval": "20 ms"}
    h = Harness(
        sales_job(tmp_path),
        runtime,
        Storage(str(tmp_path / "st")),
        settings=settings,
        services=True,
    )
    check = InputsReady(h)
    runtime.on_deploy = check
    h.start()
    try:
        assert runtime.keys() == [(P, 0, 0), (P, 1, 0)]
        h.run((P, 0, 0))
        h.run((P, 1, 0))
        assert runtime.keys(2) == [(F, 0, 0), (F, 1, 0), (F, 2, 0)]
        assert len(h.driver.pool.pending()) == 9  # final#3..#11 wait for slots

        release_partition(h.driver.storage, h.driver.job_id, r.PartitionRef(P, 0, 0))
        outcome = h.run((F, 0, 0))
        assert outcome.error is r.ErrorKind.PARTITION_MISSING
        assert outcome.missing_partition == r.PartitionRef(P, 0, 0)
        assert runtime.keys(5) == []  # a slot is free, but every final reads partial#0

        before = len(runtime.deployed)
        h.command(restart(h.driver.job_id, "failover-1", (P, 0), (F, 0)))
        assert runtime.wait_deployed(before + 1), (h.driver.message, check.problems)
        assert runtime.keys(before)[0] == (P, 0, 1)  # the producer first, no consumer
        h.run((P, 0, 1))

        # final#1 and #2 were deployed before the loss and read the deleted attempt: they fail
        # too, and the failover service restarts them.
        for k in (1, 2):
            assert h.run((F, k, 0)).error is r.ErrorKind.PARTITION_MISSING
        h.command(restart(h.driver.job_id, "failover-2", (F, 1), (F, 2)))
        result = run_all(h)
    finally:
        h.stop()
    assert result.status == "SUCCEEDED", result.message
    assert check.problems == [] and check.checked == len(runtime.deployed)
    assert output_totals(tmp_path) == expected_totals(tmp_path)
    failed = [(e.vertex, e.subtask, e.error) for e in events_of(h, r.AttemptFailed)]
    assert failed == [(F, k, r.ErrorKind.PARTITION_MISSING) for k in (0, 1, 2)]
    assert [a.attempt for a in result.attempts if a.vertex == P and a.subtask == 0] == [0, 1]
    assert result.commands_rejected == ()


def test_a_restarted_producer_is_deployed_at_once_behind_stale_consumer_requests(
    tmp_path: Path,
) -> None:
    runtime = FakeRuntime.hosts(h1=1)
    h = Harness(
        sales_job(tmp_path),
        runtime,
        Storage(str(tmp_path / "st")),
        settings=NO_DECIDER,
        services=True,
    )
    h.start()
    try:
        h.run((P, 0, 0))
        h.run((P, 1, 0))
        release_partition(h.driver.storage, h.driver.job_id, r.PartitionRef(P, 0, 0))
        assert h.run((F, 0, 0)).error is r.ErrorKind.PARTITION_MISSING
        before = len(runtime.deployed)
        h.command(restart(h.driver.job_id, "failover-1", (P, 0), (F, 0)))
        # The one slot is free and partial#0 is the only task that can use it.
        assert runtime.keys(before) == [(P, 0, 1)]
    finally:
        h.stop()


# ------------------------------------------------------------------------------ internal errors


class StartFails(FakeRuntime):
    def start(self, job_id: str, post: Post) -> None:
        raise OSError("cannot bind the runner listener")


def deploy_fails(slot: str, spec: TaskSpec) -> None:
    raise RuntimeError("connection reset")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: FakeRuntime([("h1", "h1/s0")], on_deploy=deploy_fails),
            "agent error: RuntimeError('connection reset')",
        ),
        (
            lambda: StartFails([("h1", "h1/s0")]),
            "agent error: OSError('cannot bind the runner listener')",
        ),
    ],
    ids=["deploy raises", "start raises"],
)
def test_an_internal_error_fails_the_job_cleanly(tmp_path: Path, make, message: str) -> None:
    runtime = make()
    h = Harness(one_task_job(tmp_path), runtime, Storage(str(tmp_path / "st"))).start()
    result = h.result()  # run() returned: it did not raise
    assert result.status == "FAILED" and not result.ok
    assert result.message == message
    finished = h.publisher.events[-1]
    assert isinstance(finished, r.JobFinished) and finished.status is r.JobStatus.FAILED
    assert finished.message == message
    # JobFinished is the last record before the publisher (and the archive) closed.
    assert h.publisher.closed_after == len(h.publisher.events)
    assert runtime.closed
    assert isinstance(h.publisher.events[0], r.JobSubmitted)


def test_an_inconsistent_report_fails_the_job_cleanly(tmp_path: Path) -> None:
    """A sink attempt that claims success without staged output: the driver cannot commit it;
    an internal error, which ends the job FAILED with its JobFinished."""
    runtime = FakeRuntime.hosts(h1=1)
    h = Harness(one_task_job(tmp_path), runtime, Storage(str(tmp_path / "st"))).start()
    h.finish(("src→out", 0, 0))  # made-up outcome: no `staged`
    result = h.result()
    assert result.status == "FAILED" and result.message.startswith("agent error: AssertionError")
    assert isinstance(h.publisher.events[-1], r.JobFinished)
    assert h.publisher.closed_after == len(h.publisher.events)


# ------------------------------------------------------------------------------ lost runners


def test_a_lost_busy_runner_fails_its_attempt_node_lost_and_it_is_retried_elsewhere(
    tmp_path: Path,
) -> None:
    runtime = FakeRuntime.hosts(h1=1, h2=1)
    h = Harness(
        one_task_job(tmp_path),
        runtime,
        Storage(str(tmp_path / "st")),
        services=False,
        settings=FAST_RESTART,
    ).start()
    try:
        first = runtime.of(("src→out", 0, 0))
        assert first.slot == "h1/s0"
        ensured = runtime.ensure_calls
        mark = len(h.publisher.events)
        h.post(RunnerLost("h1/s0", "executor lost"))
        (failed,) = events_of(h, r.AttemptFailed, mark)
        assert (failed.error, failed.host, failed.attempt) == (r.ErrorKind.NODE_LOST, "h1", 0)
        assert "h1/s0" in failed.message and "executor lost" in failed.message
        (removed,) = events_of(h, r.NodeRemoved, mark)
        assert (removed.host, removed.reason) == ("h1", "executor lost")
        assert runtime.ensure_calls > ensured  # a replacement runner is asked for
        # The local failover (services off) restarts it; only h2 is left.
        assert [c.command_type for c in events_of(h, r.CommandApplied, mark)] == ["RestartTasks"]
        retry = runtime.of(("src→out", 0, 1))
        assert retry.slot == "h2/s0"

        # A late report from the lost runner changes nothing.
        h.post(FromRunner("h1/s0", AttemptEnded(first.key, ok_outcome(first.spec), 0.0), 0.0))
        assert events_of(h, r.AttemptFinished) == []
        h.run(("src→out", 0, 1))
        result = h.result()
    finally:
        h.stop()
    assert result.status == "SUCCEEDED"
    assert result.runners_lost == 1
    assert [(a.attempt, a.host, a.status) for a in result.attempts] == [
        (0, "h1", "FAILED"),
        (1, "h2", "FINISHED"),
    ]


def test_a_host_with_slots_left_stays_and_its_last_slot_removes_it(tmp_path: Path) -> None:
    runtime = FakeRuntime.hosts(h1=2)
    h = Harness(
        one_task_job(tmp_path, parallelism=2),
        runtime,
        Storage(str(tmp_path / "st")),
        services=False,
        settings=FAST_RESTART,
    ).start()
    try:
        assert {runtime.of(("src→out", k, 0)).slot for k in (0, 1)} == {"h1/s0", "h1/s1"}
        lost = runtime.of(("src→out", 0, 0)).slot
        mark = len(h.publisher.events)
        h.post(RunnerLost(lost, "worker process ended"))
        assert [e.error for e in events_of(h, r.AttemptFailed, mark)] == [r.ErrorKind.NODE_LOST]
        assert events_of(h, r.NodeRemoved, mark) == []  # h1 keeps a slot
        assert h.driver.pool.total_slots() == 1
        # The retry waits for that slot, and gets it when the other attempt ends.
        other = "h1/s1" if lost == "h1/s0" else "h1/s0"
        assert runtime.keys(2) == []
        h.run(("src→out", 1, 0))
        assert runtime.of(("src→out", 0, 1)).slot == other
        h.post(RunnerLost(other, "executor lost"))
        (removed,) = events_of(h, r.NodeRemoved, mark)
        assert removed.host == "h1"
        assert h.driver.pool.hosts == {}
    finally:
        h.stop()


# ------------------------------------------------------------------------------ slot reuse


def test_a_cancelled_attempts_slot_goes_to_the_next_queued_task(tmp_path: Path) -> None:
    """A speculative copy loses the race and is cancelled (LOST_RACE); when its runner reports
    the end, the next queued task is deployed to that very slot at once."""
    write_parquet_input(tmp_path / "in.parquet")
    job = Job("reuse")
    src = job.read_parquet(str(tmp_path / "in.parquet"), name="src", parallelism=1)
    b = src.partition_by("region").map(lambda t: t, name="b", parallelism=3)
    b.write_parquet(str(tmp_path / "out"), name="out", parallelism=3)
    runtime = FakeRuntime.hosts(h1=1, h2=1)
    h = Harness(job, runtime, Storage(str(tmp_path / "st")), services=True, settings=NO_DECIDER)
    h.start()
    try:
        assert runtime.keys() == [("src", 0, 0)] and runtime.of(("src", 0, 0)).slot == "h1/s0"
        h.command(
            r.LaunchSpeculativeAttempts(
                job_id="job", ts=1, id="spec-1", vertex="src", subtask=0, count=1
            )
        )
        copy = runtime.of(("src", 0, 1))
        assert copy.slot == "h2/s0"  # not on h1, where the original runs
        h.run(("src", 0, 0))  # the original wins
        assert runtime.cancelled == [("h2/s0", AttemptKey("src", 0, 1))]
        (lost,) = events_of(h, r.AttemptCanceled)
        assert (lost.attempt, lost.reason) == (1, r.CancelReason.LOST_RACE)
        assert runtime.keys(2) == [("b→out", 0, 0)]  # into the winner's slot
        assert runtime.of(("b→out", 0, 0)).slot == "h1/s0"
        assert len(h.driver.pool.pending()) == 2  # b#1, b#2 wait for a slot

        report = runtime.execute(("src", 0, 1), cancel=True)  # the copy notices the flag
        assert isinstance(report.message, AttemptEnded) and report.message.outcome.cancelled
        started = time.perf_counter()
        h.post(report)
        elapsed_ms = (time.perf_counter() - started) * 1000.0
        assert runtime.keys(3) == [("b→out", 1, 0)]
        assert runtime.of(("b→out", 1, 0)).slot == "h2/s0"  # the cancelled attempt's slot
        print(f"cancelled attempt's end -> next deploy to its slot: {elapsed_ms:.2f} ms")
        assert elapsed_ms < 1000.0
        result = run_all(h)
    finally:
        h.stop()
    assert result.status == "SUCCEEDED"
    assert result.speculative_attempts == 1 and result.speculative_wins == 0
    assert events_of(h, r.AttemptFailed) == []
    assert len(events_of(h, r.AttemptCanceled)) == 1  # no second event for the reported end


# ------------------------------------------------------------------------------ progress


def test_runner_progress_becomes_an_attempt_progress_event(tmp_path: Path) -> None:
    runtime = FakeRuntime.hosts(h1=1)
    h = Harness(one_task_job(tmp_path), runtime, Storage(str(tmp_path / "st"))).start()
    try:
        d = runtime.of(("src→out", 0, 0))
        runtime.report(d.slot, AttemptStarted(d.key))
        h.post(FromRunner(d.slot, AttemptProgressed(d.key, 5, 500, 1000), time.perf_counter()))
        (progress,) = events_of(h, r.AttemptProgress)
        assert (progress.vertex, progress.subtask, progress.attempt, progress.host) == (
            "src→out",
            0,
            0,
            "h1",
        )
        assert (progress.records_read, progress.bytes_read, progress.bytes_total) == (5, 500, 1000)
        assert len(h.driver.deploy_to_running_ms) == 1
        # About an attempt the slot does not hold (a stale report): ignored.
        stale = AttemptKey("src→out", 0, 7)
        h.post(FromRunner(d.slot, AttemptProgressed(stale, 9, 9, None), time.perf_counter()))
        assert len(events_of(h, r.AttemptProgress)) == 1
    finally:
        h.stop()


# ------------------------------------------------------------------------------ chains


def test_a_chain_runs_as_one_attempt_per_subtask_and_writes_no_inner_partition(
    tmp_path: Path,
) -> None:
    runtime = FakeRuntime.hosts(h1=2, h2=1)
    h = Harness(
        sales_job(tmp_path, final_parallelism=2),
        runtime,
        Storage(str(tmp_path / "st")),
        settings={**QUIET, **SMALL},
    )
    partitions: list[list[str]] = []

    def look(slot: str, spec: TaskSpec) -> None:
        if spec.vertex == F:  # the producers are done: what did they leave on storage?
            partitions.append(spec.storage.list_dir(spec.storage.path(spec.job_id, "partitions")))

    runtime.on_deploy = look
    h.start()
    try:
        result = run_all(h)
    finally:
        h.stop()
    assert result.status == "SUCCEEDED", result.message
    (submitted,) = events_of(h, r.JobSubmitted)
    assert [(v.name, v.operators) for v in submitted.graph.vertices] == [
        (P, ("sales", "score", "partial")),
        (F, ("final", "out")),
    ]
    assert [(e.source, e.target) for e in submitted.graph.edges] == [(P, F)]
    deploying = [(e.vertex, e.subtask, e.attempt) for e in events_of(h, r.AttemptDeploying)]
    assert sorted(deploying) == [(F, 0, 0), (F, 1, 0), (P, 0, 0), (P, 1, 0)]
    assert result.chains == {P: ("sales", "score", "partial"), F: ("final", "out")}
    assert partitions == [[P], [P]]  # no partition of score or sales
    assert output_totals(tmp_path) == expected_totals(tmp_path)
