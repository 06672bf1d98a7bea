"""Properties of the slow-host rule over random clusters, sizes, noise and report timing."""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from slow_host_histories import INTERVAL_MS, MB, Job, Run, run_job
from speculation_histories import JobEvents, one_split_each, source
from tests.examples_budget import examples

from tailguard.detector.policy import SlowTaskDetector
from tailguard.detector.policy.slow_host import median_without
from tailguard.model import records as r
from tailguard.model.config import Settings
from tailguard.replay.engine import Recorded, replay

EXAMPLES = settings(max_examples=examples(25), deadline=None)

noise = st.floats(0.7, 1.3)
SPARK_VIEW: dict[str, Any] = {"sizes_known": False, "report_every": 4}


@st.composite
def noisy_jobs(draw: st.DrawFn, slow_factor: float | None = None, tails: bool = False) -> Job:
    """4-8 hosts of 1-2 slots, 8-30 tasks of 10-200 MB (skew up to 20x) that read steadily
    (byte by byte, or in batches of 0.125-1.5 MB, up to 0.9 of a report interval, so that a
    report lags the work: docs/policies/detector.md says why not longer) or all at once, every
    time per byte within +-30% of one value: per task, per host, or both within the band.
    Either tailguard's runners' view (sizes known, a report every Tick) or Spark's (no size
    known before an attempt ends, a report every 4 Ticks: an executor's heartbeat).
    With `slow_factor`, host 0 is that many times slower on top. With `tails`, a task that
    reads steadily may read for only 30-70% of its time and process what it read after."""
    hosts = draw(st.integers(4, 8))
    tasks = draw(st.integers(8, 30))
    sizes = tuple(draw(st.lists(st.integers(10, 200), min_size=tasks, max_size=tasks)))
    per = draw(st.sampled_from(["task", "host"]))
    task_factor = tuple(draw(st.lists(noise, min_size=tasks, max_size=tasks)))
    host_factor = list(draw(st.lists(noise, min_size=hosts, max_size=hosts)))
    if per == "task":
        host_factor = [1.0] * hosts
    else:
        task_factor = (1.0,) * tasks
    if slow_factor is not None:
        host_factor[0] = slow_factor * (1.0 if per == "task" else host_factor[0])
    return Job(
        host_factor=tuple(host_factor),
        task_bytes=tuple(s * MB for s in sizes),
        task_factor=task_factor,
        ms_per_mb=300.0,
        slots=draw(st.integers(1, 2)),
        front_loaded=draw(st.booleans()),
        batch_bytes=draw(st.one_of(st.none(), st.integers(1, 12).map(lambda b: b * MB // 8))),
        **(SPARK_VIEW if draw(st.booleans()) else {}),
        read_share=draw(st.sampled_from([1.0, 0.7, 0.5, 0.3])) if tails else 1.0,
    )


@EXAMPLES
@given(noisy_jobs(tails=True))
def test_noise_within_30_percent_never_finds_or_blocks_a_host(job: Job) -> None:
    run = run_job(job)
    assert [f.slow_hosts for f in run.findings if f.slow_hosts] == []
    assert run.blocked() == set()


@EXAMPLES
@given(st.data(), st.floats(5.0, 8.0), st.booleans())
def test_a_uniformly_slow_host_is_found_by_its_third_report_and_alone(
    data: st.DataObject, factor: float, spark: bool
) -> None:
    # 5-8x slower than its slowest peer can be (1.3 / 0.7 on top of the factor): the rule reads
    # a report as if a grain more had been read (it cannot tell a steady reader from one whose
    # batch is nearly done), so at the third report a host must show 2.5 x 4/3 = 3.3x.
    job = data.draw(noisy_jobs(slow_factor=factor * 1.3 / 0.7))
    # Steady readers, byte by byte: their rate shows from the first reports (one that reads its
    # input at once is found later, at 2.5x its peers' time, and one that reads in batches at
    # the batches' pace: test_detector_slow_host.py).
    view: dict[str, Any] = {"sizes_known": True, "report_every": 1}
    if spark:
        # Spark's view (a heartbeat every 4 Ticks, no size): still reading at every report,
        # its tasks' averages are rates and the running peers judge them, before any peer has
        # finished (tasks of 30-60 s; with tasks of a heartbeat or two the peers finish first
        # and judge it from there).
        view = {**SPARK_VIEW, "task_bytes": tuple(max(b, 100 * MB) for b in job.task_bytes)}
    job = dataclasses.replace(job, slots=1, front_loaded=False, batch_bytes=None, **view)
    run = run_job(job)
    found = run.found("h0")
    report = job.report_every * INTERVAL_MS
    assert found and found[0] <= run.first_report["h0"] + 2 * report
    assert {h for f in run.findings for h in f.slow_hosts} == {"h0"}
    assert run.blocked() == {"h0"}


@EXAMPLES
@given(st.data(), st.floats(5.0, 8.0), st.integers(15, 35))
def test_a_host_that_turns_slow_in_a_long_attempt_is_found_from_its_recent_reads(
    data: st.DataObject, factor: float, healthy_s: int
) -> None:
    # Tasks of 42-60 s at the usual rate; h0 turns slow 15-35 s into its first. Its average
    # since deploying would need the slow part to outweigh the healthy one (tens of seconds);
    # the recent window finds it within a few reports of reading at the peers' pace.
    job = data.draw(noisy_jobs())
    job = dataclasses.replace(
        job,
        slots=1,
        front_loaded=False,
        ms_per_mb=300.0,
        task_bytes=tuple(max(b, 200 * MB) for b in job.task_bytes),
        task_factor=tuple(min(f, 1.0) for f in job.task_factor),
        host_factor=(1.0,) * len(job.host_factor),
        turns_slow_at=healthy_s * 1000,
        late_factor=factor,
        # The runners' view: with Spark's, no size is known and only finished peers judge a
        # running attempt (none has finished in these long attempts' first minute).
        sizes_known=True,
        report_every=1,
    )
    run = run_job(job)
    found = run.found("h0")
    # h0's task may be 0.7x and its peers' 1x: 3.5x slower at least. A window must then span
    # 2.5 / (1 - 2.5 / 3.5) = 8.75 of the peers' batches (or reports) from the turn.
    batch_ms = 300 * (job.batch_bytes or 0) / MB
    assert found and found[0] <= job.turns_slow_at + 10 * max(INTERVAL_MS, batch_ms)
    assert {h for f in run.findings for h in f.slow_hosts} == {"h0"}


@EXAMPLES
@given(
    st.integers(5, 8),
    st.lists(noise, min_size=40, max_size=40),
    st.integers(0, 4_000),
    st.lists(st.integers(1_000, 12_000), min_size=1, max_size=2),
)
def test_hosts_that_join_late_and_pay_a_cold_start_are_not_found_slow(
    hosts: int, task_factor: list[float], cold_start_ms: int, late: list[int]
) -> None:
    # Tasks of ~3 s (+-30%); every slot's first attempt waits `cold_start_ms` (up to 1.3x a
    # task) before it reads, and one or two hosts join 1-12 s in. Their first attempts are
    # cold among warm ones: compared with the first wave's, which paid the same, they are
    # within the noise.
    joins = (0,) * (hosts - len(late)) + tuple(late)
    job = Job(
        host_factor=(1.0,) * hosts,
        task_bytes=(10 * MB,) * 40,
        task_factor=tuple(task_factor),
        ms_per_mb=300.0,
        joins_at=joins,
        cold_start_ms=cold_start_ms,
    )
    run = run_job(job)
    assert [f.slow_hosts for f in run.findings if f.slow_hosts] == []
    assert run.blocked() == set()


def _finished_only(peer_factors: list[float], factor: float) -> list[r.Record]:
    """Peers' attempts finish at their factor's time per byte, then h0's at `factor`; no
    progress is reported (tasks shorter than a report interval)."""
    detector = SlowTaskDetector(Settings())
    ev = JobEvents()
    n = len(peer_factors) + 1
    out: list[r.Record] = []
    events: list[r.Event] = [
        ev.submitted((source("v", (10 * MB,) * n),)),
        *(ev.node(f"h{i}") for i in range(n)),
        ev.initialized("v", one_split_each(n)),
        *(ev.deploying("v", s, 0, f"h{s}") for s in range(n)),
    ]
    ends = [(round(2000 * f), s) for s, f in enumerate([factor, *peer_factors])]
    for end, s in sorted(ends, key=lambda e: (e[1] == 0, e)):
        events.append(ev.finished("v", s, end, f"h{s}", input_bytes=10 * MB))
    events.append(ev.tick(max(end for end, _ in ends)))
    for event in events:
        out.extend(detector.handle(event))
    return out


@EXAMPLES
@given(st.lists(noise, min_size=3, max_size=10), st.floats(5.0, 10.0))
def test_a_finished_attempt_far_above_its_peers_finds_its_host(
    peers: list[float], factor: float
) -> None:
    out = _finished_only(peers, factor)
    assert [f.slow_hosts for f in out if isinstance(f, r.SlowTasksDetected)] == [("h0",)]


@EXAMPLES
@given(st.lists(noise, min_size=3, max_size=10), noise)
def test_a_finished_attempt_within_the_noise_finds_nothing(
    peers: list[float], factor: float
) -> None:
    assert _finished_only(peers, factor) == []


def _log(run: Run) -> list[Recorded]:
    return (
        [Recorded(r.EVENTS_TOPIC, e) for e in run.events]
        + [Recorded(r.FINDINGS_TOPIC, f) for f in run.findings]
        + [Recorded(r.COMMANDS_TOPIC, c) for c in run.commands]
    )


@settings(max_examples=examples(8), deadline=None)
@given(st.data(), st.sampled_from([None, 5.0]))
def test_replay_reproduces_every_verdict_and_its_commands(
    data: st.DataObject, factor: float | None
) -> None:
    run = run_job(data.draw(noisy_jobs(slow_factor=factor)))
    report = replay(_log(run), Settings())
    # The three cores the history ran through (the decider and failover read the same events
    # live, but their commands are not in this log).
    by_name = {s.service: s for s in report.services}
    for name in ("detector", "speculator", "blocklist"):
        assert by_name[name].differences == [], by_name[name].line()
    assert by_name["detector"].reproduced == len(run.findings)
    assert by_name["blocklist"].reproduced == len(
        [c for c in run.commands if not isinstance(c, r.LaunchSpeculativeAttempts)]
    )


def test_the_noise_band_is_what_keeps_it_quiet():
    # The extremes of the band: one host at 1.3, the rest at 0.7 (a slowdown of 1.86). Under
    # 2.5 nothing; with the threshold lowered to 1.5 the same noise would block a host, so the
    # property above is a property of the threshold, not of a rule that never speaks.
    job = Job(
        host_factor=(1.3, 0.7, 0.7, 0.7, 0.7),
        task_bytes=(10 * MB,) * 20,
        task_factor=(1.0,) * 20,
        ms_per_mb=300.0,
    )
    assert run_job(job).blocked() == set()
    assert run_job(job, {"slow-task-detector.slow-host.slowdown": "1.5"}).blocked() == {"h0"}


@given(
    st.lists(st.integers(0, 50).map(float), min_size=1, max_size=40),
    st.lists(st.integers(0, 39), max_size=10),
)
def test_median_without_is_the_median_of_the_rest(values: list[float], drop: list[int]) -> None:
    values.sort()
    removed = sorted(values[i] for i in set(drop) if i < len(values))
    rest = list(values)
    for value in removed:
        rest.remove(value)
    expected = statistics.median(rest) if rest else None
    assert median_without(values, removed) == expected
