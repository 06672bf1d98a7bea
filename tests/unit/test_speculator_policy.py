"""SpeculationStrategy: how many mirror attempts, where not to put them, never twice."""

from __future__ import annotations

from profiles import both_profiles  # noqa: F401  (each test under both profiles)
from speculation_histories import slow_finding

from tailguard.model.config import Settings
from tailguard.model.ids import derived_id
from tailguard.model.records import (
    LaunchSpeculativeAttempts,
    Record,
    SlowAttempt,
    SlowSubtask,
    SpeculativeAttemptWon,
)
from tailguard.speculator.policy import SpeculationStrategy


def subtask(n: int, *hosts: str, latest: int | None = None) -> SlowSubtask:
    attempts = tuple(SlowAttempt(a, h, 90_000, None, a > 0) for a, h in enumerate(hosts))
    return SlowSubtask(n, attempts, len(hosts) - 1 if latest is None else latest)


def launches(records: list[Record]) -> list[tuple[int, int, tuple[str, ...]]]:
    return [
        (r.subtask, r.count, r.avoid_hosts)
        for r in records
        if isinstance(r, LaunchSpeculativeAttempts)
    ]


def test_launches_up_to_max_concurrent_avoiding_live_hosts() -> None:
    strategy = SpeculationStrategy(
        Settings({"execution.batch.speculative.max-concurrent-executions": "3"})
    )
    out = strategy.handle(slow_finding(subtask(0, "h2"), subtask(1, "h1", "h0")))
    assert launches(out) == [(0, 2, ("h2",)), (1, 1, ("h0", "h1"))]


def test_no_launch_when_live_attempts_already_reach_the_limit() -> None:
    strategy = SpeculationStrategy(Settings())
    assert strategy.handle(slow_finding(subtask(0, "h1", "h2"))) == []


def test_a_repeated_state_never_launches_twice_and_a_new_state_is_answered() -> None:
    strategy = SpeculationStrategy(Settings())
    first = strategy.handle(slow_finding(subtask(0, "h1"), ts=1))
    assert strategy.handle(slow_finding(subtask(0, "h1"), ts=2)) == []
    # The speculative attempt failed (latest attempt 1 is gone): a new state, a new launch.
    again = strategy.handle(slow_finding(subtask(0, "h1", latest=1), ts=3))
    assert launches(first) == launches(again) == [(0, 1, ("h1",))]
    assert first[0].id == derived_id("speculator", "job", "v", 0, 0)
    assert again[0].id == derived_id("speculator", "job", "v", 0, 1)
    assert first[0].caused_by == ("f-job-v-1",)


def test_a_restarted_strategy_emits_the_same_id() -> None:
    finding = slow_finding(subtask(3, "h1"))
    ids = [r.id for r in SpeculationStrategy(Settings()).handle(finding)]
    assert ids == [r.id for r in SpeculationStrategy(Settings()).handle(finding)]


def test_unsafe_vertex_or_disabled_speculation_launches_nothing_but_counts_slow() -> None:
    unsafe = SpeculationStrategy(Settings())
    assert unsafe.handle(slow_finding(subtask(0, "h1"), safe=False)) == []
    assert unsafe.metrics()["numSlowExecutionVertices"] == 1
    disabled = SpeculationStrategy(Settings({"execution.batch.speculative.enabled": "false"}))
    assert disabled.handle(slow_finding(subtask(0, "h1"))) == []


def test_metrics_follow_latest_findings_and_wins() -> None:
    strategy = SpeculationStrategy(Settings())
    strategy.handle(slow_finding(subtask(0, "h1"), vertex="a"))
    strategy.handle(slow_finding(subtask(0, "h1"), vertex="b"))
    strategy.handle(slow_finding(subtask(0, "h1"), vertex="a", job_id="other"))
    assert strategy.metrics()["numSlowExecutionVertices"] == 3
    strategy.handle(slow_finding(vertex="a", ts=5))  # empty: vertex a of job no longer slow
    assert strategy.metrics()["numSlowExecutionVertices"] == 2
    won = SpeculativeAttemptWon(
        job_id="job", ts=6, id="w", vertex="b", subtask=0, attempt=1, host="h2"
    )
    assert strategy.handle(won) == []
    assert strategy.metrics()["numEffectiveSpeculativeExecutions"] == 1


def test_state_is_bounded_to_the_most_recent_jobs() -> None:
    strategy = SpeculationStrategy(Settings(), max_tracked_jobs=2)
    for job in ("a", "b", "c"):
        strategy.handle(slow_finding(subtask(0, "h1"), job_id=job))
    assert strategy.metrics()["jobs"] == 2
    assert strategy.metrics()["numSlowExecutionVertices"] == 2
