"""SlowTaskDetector: the FLIP-168 rules, one test per rule, plus the incremental cost. The
baseline details follow Flink 2.1's ExecutionTimeBasedSlowTaskDetector (each such test says
which method)."""

from __future__ import annotations

import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st
from profiles import both_profiles  # noqa: F401  (each test under both profiles)
from speculation_histories import JobEvents, one_split_each, operator, source

from tailguard.detector.policy import SlowTaskDetector
from tailguard.detector.policy.median import BaselineElement
from tailguard.model.config import Settings
from tailguard.model.ids import derived_id
from tailguard.model.records import (
    InputRange,
    Record,
    SlowTasksDetected,
    SpeculativeAttemptWon,
    SubtaskInputs,
)

S = 1000
MIN = 60 * S
LOW_BOUND = {"slow-task-detector.execution-time.baseline-lower-bound": "1 s"}


def feed(detector: SlowTaskDetector, *records: Record) -> list[Record]:
    out: list[Record] = []
    for record in records:
        out.extend(detector.handle(record))
    return out


def source_job(
    n: int,
    split_bytes: tuple[int, ...] | None = None,
    config: dict[str, str] | None = None,
    hosts: int = 4,
) -> tuple[SlowTaskDetector, JobEvents]:
    """A detector that knows a job with one source vertex `v` of `n` subtasks, all deployed at
    ts 0 on hosts h0.. (subtask s on h<s mod hosts>)."""
    ev = JobEvents()
    detector = SlowTaskDetector(Settings())
    splits = split_bytes if split_bytes is not None else (1000,) * n
    feed(
        detector,
        ev.submitted((source("v", splits),), config=config),
        *(ev.node(f"h{i}") for i in range(hosts)),
        ev.initialized("v", one_split_each(n)),
        *(ev.deploying("v", s, 0, f"h{s % hosts}") for s in range(n)),
    )
    return detector, ev


def test_each_test_here_runs_under_the_profile_it_names(request: pytest.FixtureRequest) -> None:
    # profiles.both_profiles runs this module under tailguard's defaults and FLIP-168's rules.
    on = Settings().flag("slow-task-detector.slow-host.enabled")
    assert on == (request.getfixturevalue("both_profiles") == "tailguard")


def findings(records: list[Record]) -> list[SlowTasksDetected]:
    return [r for r in records if isinstance(r, SlowTasksDetected)]


def slow_subtasks(records: list[Record]) -> list[int]:
    return [s.subtask for f in findings(records) for s in f.slow]


# --------------------------------------------------------------------------- baseline


def test_no_baseline_before_ratio_of_subtasks_finished() -> None:
    detector, ev = source_job(4)
    feed(detector, ev.finished("v", 0, 10 * S), ev.finished("v", 1, 10 * S, "h1"))
    # 2 of 4 finished < 0.75·4: however long subtask 3 runs, nothing is slow yet.
    assert feed(detector, ev.tick(100 * MIN)) == []
    feed(detector, ev.finished("v", 2, 100 * MIN + 1, "h2"))
    out = feed(detector, ev.tick(100 * MIN + 2))
    assert slow_subtasks(out) == [3]


def test_ratio_counts_finished_subtasks_even_when_k_attempts_finished_earlier() -> None:
    # N=7: R·N = 5.25, so 6 subtasks must finish, though K = round(5.25) = 5.
    detector, ev = source_job(7, split_bytes=(), config=LOW_BOUND)
    feed(detector, *(ev.finished("v", s, 10 * S, f"h{s % 4}") for s in range(4)))
    # A lost race that also finished: 5 finished attempts, still only 4 finished subtasks.
    feed(detector, ev.deploying("v", 0, 1 * S, "h1", attempt=1, speculative=True))
    feed(detector, ev.finished("v", 0, 11 * S, "h1", attempt=1))
    feed(detector, ev.finished("v", 4, 10 * S))
    assert feed(detector, ev.tick(100 * S)) == []  # 5 of 7 subtasks < 5.25
    feed(detector, ev.finished("v", 5, 10 * S))
    assert slow_subtasks(feed(detector, ev.tick(101 * S))) == [6]


def test_baseline_is_element_k_over_2_of_k_smallest_not_an_average() -> None:
    """ExecutionTimeBasedSlowTaskDetector.calculateFinishedTaskExecutionTimeMedian: the K
    fastest sorted, the one at index K/2 (integer division) taken, never an average."""
    # N=8, R=0.75: checked from 6 finished; K=6 smallest of the 7 finished; index 3: 13 s.
    detector, ev = source_job(8, split_bytes=(), config=LOW_BOUND)
    times = [10, 11, 12, 13, 14, 15, 100]
    feed(detector, *(ev.finished("v", s, t * S, f"h{s % 4}") for s, t in enumerate(times)))
    (finding,) = findings(feed(detector, ev.tick(200 * S)))
    assert finding.baseline_ms == 19_500  # 13 s × 1.5 (an average of 12 and 13 would be 18.75)
    assert finding.baseline_ns_per_byte is None  # no sizes known: plain times
    assert statistics.median(times[:6]) * 1.5 * S == 18_750 != finding.baseline_ms


def test_lower_bound_keeps_short_attempts_from_being_slow() -> None:
    detector, ev = source_job(4)  # default lower bound: 1 min
    feed(detector, *(ev.finished("v", s, 1 * S, f"h{s}") for s in range(3)))
    assert feed(detector, ev.tick(MIN - 1)) == []  # 59.999 s ≫ 1.5 s baseline, but < 1 min
    (finding,) = findings(feed(detector, ev.tick(MIN)))
    assert [s.subtask for s in finding.slow] == [3]
    # Flink keeps the lower bound apart from the baseline (an attempt must reach both).
    assert finding.baseline_ms == 1_500


def test_time_per_byte_spares_a_subtask_that_only_has_more_data() -> None:
    detector, ev = source_job(4, split_bytes=(1000, 1000, 1000, 10_000), config=LOW_BOUND)
    feed(detector, *(ev.finished("v", s, 10 * S, f"h{s}", input_bytes=1000) for s in range(3)))
    # 100 s is 10× the others' time but for 10× the bytes: 10 ms/byte < 15 ms/byte.
    assert feed(detector, ev.tick(100 * S)) == []
    (finding,) = findings(feed(detector, ev.tick(150 * S)))
    assert finding.baseline_ns_per_byte == 15_000_000  # 10 ms/byte × 1.5, in ns
    (attempt,) = finding.slow[0].live_attempts
    assert (attempt.input_bytes, attempt.execution_time_ms, attempt.slow) == (10_000, 150 * S, True)


def test_plain_times_are_compared_when_input_bytes_are_unknown() -> None:
    detector, ev = source_job(4, split_bytes=(), config=LOW_BOUND)
    feed(detector, *(ev.finished("v", s, 10 * S, f"h{s}") for s in range(3)))
    assert feed(detector, ev.tick(15 * S - 1)) == []
    (finding,) = findings(feed(detector, ev.tick(15 * S)))
    assert finding.baseline_ms == 15 * S
    assert finding.slow[0].live_attempts[0].input_bytes is None


def test_assigned_bytes_come_from_producer_subpartition_ranges() -> None:
    ev = JobEvents()
    detector = SlowTaskDetector(Settings())
    ranges = [(0, 0)] * 3 + [(1, 1)]  # subtasks 0-2 read subpartition 0, subtask 3 reads 1
    down_inputs = tuple(
        SubtaskInputs(c, (InputRange("up", 0, 1, lo, hi),)) for c, (lo, hi) in enumerate(ranges)
    )
    feed(
        detector,
        ev.submitted((source("up", (1, 1)), operator("down")), config=LOW_BOUND),
        ev.node("h0"),
        ev.node("h1"),
        ev.initialized("up", one_split_each(2)),
        ev.deploying("up", 0, 0),
        ev.deploying("up", 1, 0, "h1"),
        ev.finished("up", 0, 1, bytes_per_subpartition=(100, 300)),
        ev.finished("up", 1, 1, "h1", bytes_per_subpartition=(100, 300)),
        ev.initialized("down", down_inputs, 1),
        *(ev.deploying("down", c, 1000, f"h{c % 2}") for c in range(4)),
        # input_bytes None: the finished attempts are normalised by their assigned 200 bytes.
        *(ev.finished("down", c, 11_000, f"h{c % 2}") for c in range(3)),
    )
    # 25 s on 600 bytes is 40 ms/byte < 1.5 × 50 ms/byte, though 25 s ≥ 1.5 × 10 s.
    assert feed(detector, ev.tick(26_000)) == []
    (finding,) = findings(feed(detector, ev.tick(46_000)))
    (attempt,) = finding.slow[0].live_attempts
    assert (finding.slow[0].subtask, attempt.input_bytes) == (3, 600)


# --------------------------------------------------------------------------- execution time


def test_execution_time_per_state() -> None:
    detector, ev = source_job(5, split_bytes=(), config=LOW_BOUND)
    # Finished: finish − deploying (all deployed at 0). N=5: K = round(3.75) = 4.
    feed(detector, *(ev.finished("v", s, (8 + s) * S, f"h{s % 4}") for s in range(4)))
    # Failed and cancelled attempts count 0: neither slow nor part of the baseline.
    feed(
        detector,
        ev.deploying("v", 4, 1 * S, "h1", attempt=1),
        ev.failed("v", 4, 500 * S, "h0", attempt=0),
    )
    (finding,) = findings(feed(detector, ev.tick(600 * S)))
    assert finding.baseline_ms == 15_000  # index 4/2 of (8, 9, 10, 11 s) = 10 s, × 1.5
    (subtask,) = finding.slow
    # Live: now − deploying of the live attempt only.
    assert [(a.attempt, a.execution_time_ms) for a in subtask.live_attempts] == [(1, 599 * S)]
    assert subtask.latest_attempt == 1


def test_finished_and_cancelled_attempts_are_never_slow() -> None:
    detector, ev = source_job(4, split_bytes=(), config=LOW_BOUND)
    feed(
        detector,
        *(ev.finished("v", s, 10 * S, f"h{s}") for s in range(2)),
        ev.deploying("v", 2, 1 * S, "h3", attempt=1, speculative=True),
        ev.finished("v", 2, 12 * S, "h3", attempt=1),
    )
    # Subtask 2's original attempt lost the race and is not cancelled yet: not checked.
    out = feed(detector, ev.tick(100 * S))
    assert slow_subtasks(out) == [3]
    feed(detector, ev.canceled("v", 2, 100 * S + 1, "h2"), ev.finished("v", 3, 100 * S + 2, "h3"))
    out = feed(detector, ev.tick(200 * S))
    assert [(f.vertex, f.slow) for f in findings(out)] == [("v", ())]  # cleared once
    assert feed(detector, ev.tick(201 * S)) == []


def test_speculative_attempt_is_judged_on_its_own_time() -> None:
    detector, ev = source_job(4, split_bytes=(), config=LOW_BOUND)
    feed(detector, *(ev.finished("v", s, 10 * S, f"h{s}") for s in range(3)))
    feed(detector, ev.deploying("v", 3, 20 * S, "h0", attempt=1, speculative=True))
    (finding,) = findings(feed(detector, ev.tick(30 * S)))
    attempts = finding.slow[0].live_attempts
    # Both live attempts are listed (the speculator counts them), only the original is slow.
    assert [(a.attempt, a.speculative, a.slow) for a in attempts] == [
        (0, False, True),
        (1, True, False),
    ]
    (finding,) = findings(feed(detector, ev.tick(35 * S)))
    assert [a.slow for a in finding.slow[0].live_attempts] == [True, True]


# --------------------------------------------------------------------------- outputs


def test_findings_repeat_every_tick_while_slow_with_tick_derived_ids_and_hosts() -> None:
    detector, ev = source_job(4, split_bytes=(), config=LOW_BOUND)
    feed(detector, *(ev.finished("v", s, 10 * S, f"h{s}") for s in range(3)))
    ticks = [ev.tick(t * S) for t in (20, 21)]
    for tick in ticks:
        (finding,) = findings(feed(detector, tick))
        assert finding.id == derived_id("detector", tick.id, "v")
        assert finding.caused_by == (tick.id,)
        assert finding.hosts == ("h0", "h1", "h2", "h3")
        assert finding.speculation_safe


def test_speculative_attempt_won_only_when_speculative_finishes_first() -> None:
    detector, ev = source_job(2, split_bytes=(), config=LOW_BOUND)
    feed(detector, ev.deploying("v", 0, 5 * S, "h1", attempt=1, speculative=True))
    feed(detector, ev.deploying("v", 1, 5 * S, "h0", attempt=1, speculative=True))
    won = feed(detector, ev.finished("v", 0, 6 * S, "h1", attempt=1))
    assert [(type(r), r.subtask) for r in won if isinstance(r, SpeculativeAttemptWon)] == [
        (SpeculativeAttemptWon, 0)
    ]
    assert feed(detector, ev.finished("v", 0, 7 * S, "h0", attempt=0)) == []
    assert feed(detector, ev.finished("v", 1, 7 * S, "h1", attempt=0)) == []


def test_job_finished_clears_slow_vertices_and_drops_state() -> None:
    detector, ev = source_job(4, split_bytes=(), config=LOW_BOUND)
    feed(detector, *(ev.finished("v", s, 10 * S, f"h{s}") for s in range(3)))
    assert slow_subtasks(feed(detector, ev.tick(20 * S))) == [3]
    (cleared,) = findings(feed(detector, ev.job_finished(21 * S)))
    assert cleared.slow == ()
    assert detector.metrics()["jobs"] == 0
    assert feed(detector, ev.tick(22 * S)) == []


def test_a_job_config_that_does_not_parse_falls_back_to_the_service_settings() -> None:
    bad = {"slow-task-detector.execution-time.baseline-lower-bound": "soon"}
    detector, ev = source_job(4, split_bytes=(), config=bad)
    assert detector.metrics()["config_errors"] == 1
    feed(detector, *(ev.finished("v", s, 10 * S, f"h{s}") for s in range(3)))
    assert feed(detector, ev.tick(MIN - 1)) == []  # the default lower bound: 1 min
    assert slow_subtasks(feed(detector, ev.tick(MIN))) == [3]


def test_unknown_jobs_vertices_and_attempts_are_ignored() -> None:
    detector, ev = source_job(2)
    other = JobEvents("other")
    assert feed(detector, other.tick(1), other.deploying("v", 0, 1)) == []
    assert feed(detector, ev.finished("nope", 0, 5), ev.deploying("nope", 0, 5)) == []
    assert feed(detector, ev.finished("v", 7, 5), ev.canceled("v", 9, 5)) == []
    assert feed(detector, ev.initialized("v", ())) == []  # parallelism 0: ignored
    # Subtask 7 of a 2-subtask vertex did not count: 1 of 2 finished is below R·N = 1.5.
    feed(detector, ev.finished("v", 0, 5))
    assert feed(detector, ev.tick(100 * MIN)) == []


# --------------------------------------------------------------------------- incremental cost


def test_tick_work_is_proportional_to_old_live_attempts_not_finished_ones() -> None:
    costs = []
    for finished in (100, 760, 990):
        detector, ev = source_job(1000, split_bytes=(), hosts=10)
        # Everything not finished and not among the last 5 subtasks fails: 5 stay live.
        feed(detector, *(ev.finished("v", s, 10 * S, f"h{s % 10}") for s in range(finished)))
        feed(detector, *(ev.failed("v", s, 10 * S, f"h{s % 10}") for s in range(finished, 995)))
        # 3 more attempts, too young to be slow: the walk stops at the first of them.
        feed(detector, *(ev.deploying("v", s, 2 * MIN, "h0", 1, True) for s in range(995, 998)))
        before = detector.metrics()["attempts_examined"]
        feed(detector, ev.tick(2 * MIN + 1))
        costs.append(detector.metrics()["attempts_examined"] - before)
    # Below the ratio nothing is walked; above it the 5 old live attempts and the first young
    # one, however many attempts have finished.
    assert costs == [0, 6, 6]


@given(st.integers(1, 40), st.lists(st.integers(0, 10_000), max_size=200))
def test_baseline_element_matches_sorting(k: int, values: list[int]) -> None:
    """calculateFinishedTaskExecutionTimeMedian: sorted(...).limit(K).get(K / 2)."""
    element = BaselineElement(k)
    for count, value in enumerate(values, 1):
        element.add(value, count, (value, None))
        got = element.element()
        if count >= k:
            assert got is not None and got[0] == sorted(values[:count])[:k][k // 2]
        elif count < k // 2 + 1:
            assert got is None


# --------------------------------------------------------------------------- Flink 2.1 details


def test_ratio_zero_gives_a_zero_baseline_and_every_attempt_past_the_bound_is_slow() -> None:
    """ExecutionTimeBasedSlowTaskDetector: K = round(N · 0) = 0 -> baseline (0, UNKNOWN), and
    getFinishedRatio >= 0 holds with nothing finished."""
    config = {**LOW_BOUND, "slow-task-detector.execution-time.baseline-ratio": "0"}
    detector, ev = source_job(4, config=config)
    assert feed(detector, ev.tick(S - 1)) == []  # below the lower bound
    (finding,) = findings(feed(detector, ev.tick(S)))
    assert finding.baseline_ms == 0
    assert [s.subtask for s in finding.slow] == [0, 1, 2, 3]


def test_zero_input_bytes_is_the_smallest_positive_size_not_unknown() -> None:
    """ExecutionTimeWithInputBytes.compareTo: time / max(bytes, Double.MIN_VALUE)."""
    detector, ev = source_job(4, split_bytes=(1000, 1000, 1000, 0), config=LOW_BOUND)
    feed(detector, *(ev.finished("v", s, 10 * S, f"h{s}", input_bytes=1000) for s in range(3)))
    # Subtask 3 read 0 bytes: per byte it is infinitely slow once past the lower bound (with
    # 0 taken as unknown it would be judged on plain time, 15 s, and not be slow at 2 s).
    (finding,) = findings(feed(detector, ev.tick(2 * S)))
    (attempt,) = finding.slow[0].live_attempts
    assert (attempt.input_bytes, attempt.slow) == (0, True)


def test_baseline_time_is_rounded_down_before_dividing_by_bytes() -> None:
    """getBaseline: (long) (median time × multiplier), then per the median's input bytes."""
    # Times 1001 ms, × 1.5 = 1501.5 -> 1501 ms over 1000 bytes: 1.501 ms/byte.
    config = {"slow-task-detector.execution-time.baseline-lower-bound": "0 ms"}
    detector, ev = source_job(4, split_bytes=(1000,) * 4, config=config)
    feed(detector, *(ev.finished("v", s, 1001, f"h{s}", input_bytes=1000) for s in range(3)))
    assert findings(feed(detector, ev.tick(1500))) == []
    (finding,) = findings(feed(detector, ev.tick(1501)))
    assert finding.baseline_ms == 1501
    assert finding.baseline_ns_per_byte == 1_501_000.0
