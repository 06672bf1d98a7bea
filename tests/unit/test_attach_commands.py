"""Attach mode's guards: each command checked against the application as the relay sees it, and
turned into the action the JVM actuator applies, or the reason it is refused."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import pytest

from tailguard.model import records as r
from tailguard.model.fleet import FLEET_CAUSE_PREFIX
from tailguard.observer import command_guards as ac
from tailguard.observer.query_plans import PLAN_VERTEX, PlanRequest
from tailguard.observer.translate import RunningTask

JOB = "app-1-job-0"
NOW = 1_000_000


@dataclass
class FakeApp:
    hosts: Collection[str] = ("h1", "h2", "h3")
    blocked: Collection[str] = ()
    max_blocked_fraction: float = 0.5
    fleet_enabled: bool = True
    spark_jobs: dict[str, int] = field(default_factory=lambda: {JOB: 0})
    tasks: dict[tuple[str, int], list[RunningTask]] = field(default_factory=dict)
    parallelism: dict[str, int] = field(default_factory=lambda: {"stage-1": 4})
    plans: dict[str, PlanRequest] = field(default_factory=dict)

    def plan_request(self, job_id: str) -> PlanRequest | None:
        return self.plans.get(job_id)

    def running_job(self, job_id: str) -> int | None:
        return self.spark_jobs.get(job_id)

    def subtask_problem(self, job_id: str, vertex: str, subtask: int) -> str | None:
        if job_id not in self.spark_jobs:
            return f"job {job_id} is not running"
        if vertex not in self.parallelism:
            return f"unknown vertex {vertex!r}"
        if not 0 <= subtask < self.parallelism[vertex]:
            return f"unknown subtask {vertex}#{subtask}"
        return None

    def running_tasks(self, job_id: str, vertex: str, subtask: int) -> Sequence[RunningTask]:
        return self.tasks.get((vertex, subtask), [])


def task(task_id: int, host: str, launched: int = NOW - 5_000, index: int = 2) -> RunningTask:
    return RunningTask(
        task_id, stage=1, stage_attempt=0, index=index, host=host, launched_ts=launched
    )


def speculate(count: int = 1, subtask: int = 2) -> r.LaunchSpeculativeAttempts:
    return r.LaunchSpeculativeAttempts(
        job_id=JOB, ts=NOW, id="speculator-a", vertex="stage-1", subtask=subtask, count=count
    )


def block(*hosts: str, cause: str = "slow") -> r.BlockNodes:
    return r.BlockNodes(
        job_id=JOB, ts=NOW, id="blocklist-a", hosts=hosts, until_ts=NOW + 60_000, cause=cause
    )


def test_a_running_task_gets_one_copy_where_spark_keeps_it() -> None:
    app = FakeApp(tasks={("stage-1", 2): [task(17, "h1")]})
    assert ac.action_for(speculate(), app) == ac.Speculate(stage=1, stage_attempt=0, index=2)
    line = ac.action_line("speculator-a", ac.Speculate(1, 0, 2))
    assert line == "SPEC\tspeculator-a\t1\t0\t2\n"


@pytest.mark.parametrize(
    ("app", "command", "reason"),
    [
        (FakeApp(), speculate(), "has no running attempt to copy"),
        (
            FakeApp(tasks={("stage-1", 2): [task(17, "h1"), task(18, "h2")]}),
            speculate(),
            "already has 2 attempts running",
        ),
        (FakeApp(tasks={("stage-1", 2): [task(17, "h1")]}), speculate(count=2), "at most one copy"),
        (FakeApp(), speculate(subtask=9), "unknown subtask stage-1#9"),
        (FakeApp(spark_jobs={}), speculate(), "is not running"),
        (
            FakeApp(hosts=("h1", "h2"), blocked=("h2",), tasks={("stage-1", 2): [task(17, "h1")]}),
            speculate(),
            "no host but h1",
        ),
    ],
)
def test_copies_spark_cannot_run_are_refused(
    app: FakeApp, command: r.LaunchSpeculativeAttempts, reason: str
) -> None:
    refused = ac.action_for(command, app)
    assert isinstance(refused, str) and reason in refused


def test_a_block_excludes_the_host_for_the_application() -> None:
    assert ac.action_for(block("h2"), FakeApp()) == ac.Exclude(("h2",), NOW + 60_000, "slow")


@pytest.mark.parametrize(
    ("app", "command", "reason"),
    [
        (FakeApp(), block("h1", "h2", "h3"), "would block the last usable hosts"),
        (FakeApp(hosts=("h1",)), block("h1"), "would block the last usable hosts"),
        (FakeApp(), block("h1", "h2"), "over blocklist.max-blocked-fraction"),
        (FakeApp(), block("elsewhere"), "unknown host(s) ['elsewhere']"),
        (FakeApp(), block(), "no hosts to block"),
        (
            FakeApp(fleet_enabled=False),
            block("h2", cause=FLEET_CAUSE_PREFIX + "x"),
            "opted out of the fleet blocklist",
        ),
    ],
)
def test_blocks_that_would_stop_the_application_are_refused(
    app: FakeApp, command: r.BlockNodes, reason: str
) -> None:
    refused = ac.action_for(command, app)
    assert isinstance(refused, str) and reason in refused, refused


def test_unblocking_lifts_only_what_is_blocked() -> None:
    unblock = r.UnblockNodes(job_id=JOB, ts=NOW, id="blocklist-b", hosts=("h1", "h2"))
    assert ac.action_for(unblock, FakeApp(blocked=("h2",))) == ac.Include(("h2",))
    assert isinstance(ac.action_for(unblock, FakeApp()), ac.NoAction)


def test_a_restart_kills_the_attempts_from_before_the_decision() -> None:
    old, retry = task(17, "h1", launched=NOW - 1), task(18, "h2", launched=NOW + 5)
    app = FakeApp(tasks={("stage-1", 2): [old, retry]})
    restart = r.RestartTasks(
        job_id=JOB,
        ts=NOW,
        id="failover-a",
        tasks=(r.TaskRef("stage-1", 2),),
        reason="lost",
        not_before_ts=NOW,
    )
    action = ac.action_for(restart, app)
    assert isinstance(action, ac.Kill) and action.task_ids == (17,)
    # Only Spark's own retry runs: it is already the restart.
    assert isinstance(ac.action_for(restart, FakeApp(tasks={("stage-1", 2): [retry]})), ac.NoAction)


def test_fail_job_cancels_the_spark_job_and_set_parallelism_is_not_for_a_planned_stage() -> None:
    fail = r.FailJob(job_id=JOB, ts=NOW, id="failover-b", reason="too many restarts")
    assert ac.action_for(fail, FakeApp(spark_jobs={JOB: 7})) == ac.CancelJob(
        7, "tailguard FailJob failover-b: too many restarts"
    )
    assert "is not running" in str(ac.action_for(fail, FakeApp(spark_jobs={})))
    set_p = r.SetParallelism(
        job_id=JOB, ts=NOW, id="decider-a", vertex="stage-1", parallelism=2, subtask_inputs=()
    )
    assert "keeps its task count" in str(ac.action_for(set_p, FakeApp()))


PLAN_JOB = "app-1-job-plan-3"
PLAN = PlanRequest(
    3, PLAN_JOB, NOW, 6, 1, (("shuffle-0", (1, 1, 1, 1, 1, 1)), ("shuffle-1", (2,) * 6))
)


def plan_decision(*ranges: tuple[int, int], other: tuple[tuple[int, int], ...] = ()) -> r.Command:
    """A SetParallelism for PLAN_JOB: subtask k reads `ranges[k]` of shuffle-0 and `other[k]`
    (default: the same) of shuffle-1."""
    other = other or ranges
    return r.SetParallelism(
        job_id=PLAN_JOB,
        ts=NOW,
        id="decider-p",
        vertex=PLAN_VERTEX,
        parallelism=len(ranges),
        subtask_inputs=tuple(
            r.SubtaskInputs(
                k,
                (
                    r.InputRange("shuffle-0", 0, 0, *ranges[k]),
                    r.InputRange("shuffle-1", 0, 0, *other[k]),
                ),
            )
            for k in range(len(ranges))
        ),
    )


def test_a_waiting_query_stage_reads_the_deciders_ranges() -> None:
    app = FakeApp(plans={PLAN_JOB: PLAN})
    action = ac.action_for(plan_decision((0, 1), (2, 5)), app)
    assert action == ac.Coalesce(3, (2, 6))
    assert ac.action_line("decider-p", action) == "RANGES\tdecider-p\t3\t2,6\n"


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        (plan_decision((0, 1), (2, 5), other=((0, 2), (3, 5))), "different ranges"),
        (plan_decision((0, 1), (3, 5)), "not from 2"),
        (plan_decision((0, 1), (2, 4)), "not 6"),
    ],
)
def test_ranges_spark_cannot_read_are_refused(command: r.Command, reason: str) -> None:
    assert reason in str(ac.action_for(command, FakeApp(plans={PLAN_JOB: PLAN})))


def test_a_decision_for_a_stage_no_longer_waiting_is_refused() -> None:
    assert "no query stage waits" in str(ac.action_for(plan_decision((0, 5)), FakeApp()))


def test_free_text_cannot_split_an_action_line() -> None:
    line = ac.action_line("failover-c", ac.CancelJob(3, "two\tfields\nand a line"))
    assert line.count("\t") == 3 and line.endswith("two fields and a line\n")
