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


# --------------------------------------------------------------------------- host corroboration


def shared_hosts(
    splits: tuple[int, ...], hosts: tuple[str, ...], config: dict[str, str]
) -> tuple[SlowTaskDetector, JobEvents]:
    """One source vertex, subtask s deployed at 0 on hosts[s] (hosts of several slots)."""
    ev = JobEvents()
    detector = SlowTaskDetector(Settings())
    feed(
        detector,
        ev.submitted((source("v", splits),), config=config),
        *(ev.node(h, slots=2) for h in sorted(set(hosts))),
        ev.initialized("v", one_split_each(len(splits))),
        *(ev.deploying("v", s, 0, h) for s, h in enumerate(hosts)),
    )
    return detector, ev


def on_hosts(
    ev: JobEvents, ts: int, read: list[int], totals: tuple[int, ...], hosts: tuple[str, ...]
) -> list[Record]:
    return [ev.progress("v", s, ts, b, totals[s], host=hosts[s]) for s, b in enumerate(read)]


TWO_HOSTS = ("hA", "hA", "hB", "hB")


def test_a_slow_attempt_beside_a_healthy_one_on_its_host_is_its_own_data_and_left_alone():
    # Subtask 3 reads at a third of the usual rate (25 s left, a copy needs 10 s: slow by the
    # time-left test), but subtask 2 on the same host reads at the usual rate: the host is
    # fine, the task's own data is slow, and a copy would be as slow.
    splits = (10 * MB,) * 4
    detector, ev = shared_hosts(splits, TWO_HOSTS, ON)
    read = [5 * MB, 5 * MB, 5 * MB, 5 * MB // 3]
    feed(detector, *on_hosts(ev, 5 * S, read, splits, TWO_HOSTS))
    assert slow(feed(detector, ev.tick(5 * S))) == []
    # The same with the corroboration off: the time-left test alone decides.
    detector, ev = shared_hosts(
        splits, TWO_HOSTS, {**ON, "slow-task-detector.progress-rate.host-corroboration": "0"}
    )
    feed(detector, *on_hosts(ev, 5 * S, read, splits, TWO_HOSTS))
    assert slow(feed(detector, ev.tick(5 * S))) == [3]


def test_a_second_slow_attempt_on_the_host_corroborates_it():
    # Subtask 4 on hB reads at half the usual rate (2 x τ per byte ≥ 1.5): the host is slow,
    # so subtask 5 beside it is. Subtask 4 itself is not slow enough for a copy (15 s left
    # against 2 x 10 s).
    splits = (10 * MB,) * 6
    hosts = ("hA", "hA", "hC", "hC", "hB", "hB")
    detector, ev = shared_hosts(splits, hosts, ON)
    read = [5 * MB] * 4 + [5 * MB // 2, 5 * MB // 3]
    feed(detector, *on_hosts(ev, 5 * S, read, splits, hosts))
    assert slow(feed(detector, ev.tick(5 * S))) == [5]


def test_the_hosts_last_finished_attempt_speaks_for_it():
    # hB's last finished attempt (subtask 4) ran at the usual 1 s per MB: subtask 3, alone
    # running on hB at a quarter of the rate, is slow by its own data. hC's last finished
    # attempt (subtask 5) took 3 s per MB: the same slowness of subtask 2 there is the host's.
    splits = (10 * MB, 100 * MB, 100 * MB, 100 * MB, 10 * MB, 10 * MB, 100 * MB, 100 * MB)
    hosts = ("hA", "hA", "hC", "hB", "hB", "hC", "hD", "hD")
    detector, ev = shared_hosts(splits, hosts, ON)
    feed(
        detector,
        ev.finished("v", 0, 10 * S, host="hA", input_bytes=10 * MB),
        ev.finished("v", 4, 10 * S, host="hB", input_bytes=10 * MB),
        ev.finished("v", 5, 30 * S, host="hC", input_bytes=10 * MB),
    )
    running = (1, 2, 3, 6, 7)
    read = [30 * MB if s in (1, 6, 7) else 30 * MB // 4 for s in range(len(splits))]
    feed(detector, *(r for r in on_hosts(ev, 30 * S, read, splits, hosts) if r.subtask in running))
    # τ = 1 s per MB (the running majority): subtasks 2 and 3 have 370 s left, ≥ 2 x 100 s.
    assert slow(feed(detector, ev.tick(30 * S))) == [2]


def test_a_negative_host_corroboration_is_refused_naming_the_key():
    import pytest

    from tailguard.detector.policy.progress import ProgressRule
    from tailguard.model.config import ConfigError

    with pytest.raises(
        ConfigError, match=r"host-corroboration must be 0 \(off\) or positive, got -1"
    ):
        ProgressRule.from_settings(
            Settings({"slow-task-detector.progress-rate.host-corroboration": "-1"})
        )
