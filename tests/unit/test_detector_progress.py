"""The opt-in progress-rate rule: LATE's time-left estimate, normalised by input bytes."""

from __future__ import annotations

from speculation_histories import JobEvents, one_split_each, source

from tailguard.detector.policy import SlowTaskDetector
from tailguard.detector.policy.progress import RunningMedian, reference_per_byte
from tailguard.model.config import Settings
from tailguard.model.records import Record, SlowTasksDetected

S = 1000
MB = 1_000_000
ON = {
    "slow-task-detector.progress-rate.enabled": "true",
    "slow-task-detector.progress-rate.min-elapsed": "5 s",
}


def feed(detector: SlowTaskDetector, *records: Record) -> list[Record]:
    out: list[Record] = []
    for record in records:
        out.extend(detector.handle(record))
    return out


def single_wave(
    splits: tuple[int, ...], config: dict[str, str]
) -> tuple[SlowTaskDetector, JobEvents]:
    """One source vertex, every subtask deployed at 0 on its own host: a single wave."""
    ev = JobEvents()
    detector = SlowTaskDetector(Settings())
    n = len(splits)
    feed(
        detector,
        ev.submitted((source("v", splits),), config=config),
        *(ev.node(f"h{i}") for i in range(n)),
        ev.initialized("v", one_split_each(n)),
        *(ev.deploying("v", s, 0, f"h{s}") for s in range(n)),
    )
    return detector, ev


def reports(ev: JobEvents, ts: int, read: list[int], totals: tuple[int, ...]) -> list[Record]:
    return [ev.progress("v", s, ts, b, totals[s], host=f"h{s}") for s, b in enumerate(read)]


def slow(records: list[Record]) -> list[int]:
    return [
        s.subtask
        for f in records
        if isinstance(f, SlowTasksDetected)
        for s in f.slow
        if any(a.slow for a in s.live_attempts)
    ]


def test_a_straggler_in_a_single_wave_vertex_is_found_before_anything_finishes():
    # 1 MB per second on healthy hosts; subtask 3's host reads at a third of that.
    splits = (10 * MB,) * 4
    detector, ev = single_wave(splits, ON)
    feed(detector, *reports(ev, 4 * S, [4 * MB, 4 * MB, 4 * MB, 4 * MB // 3], splits))
    assert slow(feed(detector, ev.tick(4 * S))) == []  # under the 5 s minimum
    feed(detector, *reports(ev, 5 * S, [5 * MB, 5 * MB, 5 * MB, 5 * MB // 3], splits))
    # At 5 s: 1.67 of 10 MB read in 5 s -> 25 s left; a fresh copy needs 10 s; 25 ≥ 2 × 10:
    # slow, though no subtask has finished (Flink's rule waits for 3 of 4 and 1 min).
    assert slow(feed(detector, ev.tick(5 * S))) == [3]


def test_a_moderately_slow_attempt_is_left_alone():
    # Half the usual rate: 10 s left at 5 s, under 2 × 10 s: a copy would not be done much
    # sooner.
    splits = (10 * MB,) * 4
    detector, ev = single_wave(splits, ON)
    feed(detector, *reports(ev, 5 * S, [5 * MB, 5 * MB, 5 * MB, 5 * MB // 2], splits))
    assert slow(feed(detector, ev.tick(5 * S))) == []


def test_a_skewed_attempt_reading_at_the_usual_rate_is_never_slow():
    # Subtask 3 has 10x the bytes and reads at the usual rate: 95 s left, a copy needs 100 s.
    splits = (10 * MB, 10 * MB, 10 * MB, 100 * MB)
    detector, ev = single_wave(splits, ON)
    for t in range(5, 10):
        feed(detector, *reports(ev, t * S, [t * MB] * 4, splits))
        assert slow(feed(detector, ev.tick(t * S))) == []


def test_nothing_read_after_the_minimum_elapsed_time_is_slow():
    splits = (10 * MB,) * 4
    detector, ev = single_wave(splits, ON)
    feed(detector, *reports(ev, 5 * S, [5 * MB, 5 * MB, 5 * MB, 0], splits))
    assert slow(feed(detector, ev.tick(5 * S))) == [3]


def test_the_rule_is_off_by_default():
    splits = (10 * MB,) * 4
    detector, ev = single_wave(splits, {})
    feed(detector, *reports(ev, 6 * S, [6 * MB, 6 * MB, 6 * MB, 0], splits))
    assert feed(detector, ev.tick(6 * S)) == []


def test_assigned_bytes_stand_in_for_an_unknown_total():
    splits = (10 * MB,) * 4
    detector, ev = single_wave(splits, ON)
    feed(
        detector,
        *(
            ev.progress("v", s, 6 * S, b, None, host=f"h{s}")
            for s, b in enumerate([6 * MB] * 3 + [2 * MB])
        ),
    )
    assert slow(feed(detector, ev.tick(6 * S))) == [3]


def test_time_left_counts_the_time_since_the_last_report():
    splits = (10 * MB,) * 4
    detector, ev = single_wave(splits, ON)
    feed(detector, *reports(ev, 6 * S, [6 * MB, 6 * MB, 6 * MB, 2 * MB], splits))
    # 24 s left at the report; 5 s later, 19 s: still ≥ 2 × 10 s? No: 19 < 20.
    assert slow(feed(detector, ev.tick(11 * S))) == []


def test_reference_is_the_median_of_the_larger_population():
    finished = RunningMedian()
    for v in (1.0, 2.0, 3.0):
        finished.add(v)
    assert reference_per_byte([10.0, 20.0], finished) == 2.0  # 3 finished > 2 running
    assert reference_per_byte([10.0, 20.0, 30.0, 40.0], finished) == 25.0
    assert reference_per_byte([], RunningMedian()) is None
