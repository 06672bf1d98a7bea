"""Attach mode's query-stage plans: a stage's shuffle reads, as the rule hands them over (`PS`),
become a job the decider decides as it decides any (FLIP-187), and its SetParallelism comes back
as reducer ranges Spark can read (`observer/query_plans.py`)."""

from __future__ import annotations

import pytest

from tailguard.decider.policy.decider import ParallelismDecider
from tailguard.model import records as r
from tailguard.model.config import Settings
from tailguard.observer import command_guards as ac
from tailguard.observer.query_plans import PLAN_VERTEX, plan_ends
from tailguard.observer.translate import ObserveError, SparkEventTranslator

MIB = 1 << 20
APP = "app-20261127-0001"


def translator() -> SparkEventTranslator:
    t = SparkEventTranslator(
        {"execution.batch.adaptive.auto-parallelism.avg-data-volume-per-task": "16 MiB"}
    )
    t.handle(["A", "1000", APP, "orders"])
    return t


def request(t: SparkEventTranslator, n: int, floor: int, *inputs: list[int]) -> list[r.Event]:
    specs = [f"{i}:{','.join(str(b) for b in sizes)}" for i, sizes in enumerate(inputs)]
    return t.handle(["PS", "2000", str(n), str(len(inputs[0])), str(floor), *specs])


def decide(events: list[r.Event]) -> r.SetParallelism:
    decider = ParallelismDecider(Settings())
    out = [c for e in events for c in decider.handle(e)]
    decisions = [c for c in out if isinstance(c, r.SetParallelism)]
    assert len(decisions) == 1, out
    return decisions[0]


def test_a_join_stage_gets_one_set_of_ranges_for_both_sides() -> None:
    t = translator()
    # 20 reducer partitions, 8 MiB each on the left, one skewed 40 MiB on the right.
    left = [8 * MIB] * 20
    right = [MIB] * 20
    right[7] = 40 * MIB
    events = request(t, 1, 1, left, right)
    submitted = events[0]
    assert isinstance(submitted, r.JobSubmitted) and submitted.job_id == f"{APP}-job-plan-1"
    reader = next(v for v in submitted.graph.vertices if v.name == PLAN_VERTEX)
    assert reader.parallelism is None and reader.max_parallelism == 20
    decision = decide(events)
    plan = t.plan_request(decision.job_id)
    assert plan is not None
    ends = plan_ends(decision, plan)
    assert isinstance(ends, tuple), ends
    assert ends[-1] == 20 and list(ends) == sorted(set(ends))
    # Byte-balanced under V = 16 MiB across both inputs: no range but the skewed partition's
    # holds more than V, and the skewed one is alone.
    start = 0
    for end in ends:
        size = sum(left[start:end]) + sum(right[start:end])
        assert size <= 16 * MIB or end - start == 1
        start = end
    assert 7 in ends and 8 in ends  # the skewed partition is a range of its own
    assert isinstance(ac.action_for(decision, _App(t)), ac.Coalesce)


def test_the_rules_floor_is_the_vertex_minimum() -> None:
    t = translator()
    decision = decide(request(t, 2, 4, [MIB] * 12))
    assert decision.parallelism == 4  # 12 MiB is one task's worth, but Spark would run 4


def test_the_end_line_closes_the_plan_job_and_a_late_decision_has_nothing_to_apply() -> None:
    t = translator()
    decision = decide(request(t, 3, 1, [MIB] * 4))
    [finished] = t.handle(["PE", "2500", "3", "no decision within 2000 ms"])
    assert isinstance(finished, r.JobFinished) and finished.status is r.JobStatus.CANCELED
    assert "Spark's ranges kept" in finished.message
    assert t.plan_request(decision.job_id) is None
    assert "no query stage waits" in str(ac.action_for(decision, _App(t)))
    # The outcome still lands in the plan job's record.
    assert (
        t.job_event(
            decision.job_id,
            r.CommandRejected,
            2600,
            command_id="x",
            command_type="SetParallelism",
            reason="late",
        )
        is not None
    )


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (["PS", "1", "1", "3", "1", "0:1,2"], "gives 2 partition sizes, not 3"),
        (["PS", "1", "1", "3", "1"], "without inputs"),
        (["PE", "1", "9", "applied"], "not requested"),
    ],
)
def test_malformed_plan_lines_name_the_problem(line: list[str], problem: str) -> None:
    with pytest.raises(ObserveError, match=problem):
        translator().handle(line)


class _App:
    """The guard's view of the application: the translator's plans (the rest unused here)."""

    def __init__(self, t: SparkEventTranslator) -> None:
        self._t = t
        self.hosts: list[str] = []
        self.blocked: list[str] = []
        self.max_blocked_fraction = 0.5
        self.fleet_enabled = True

    def plan_request(self, job_id: str) -> object:
        return self._t.plan_request(job_id)
