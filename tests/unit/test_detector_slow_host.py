"""The slow-host rule (tailguard's default): a host found slow from its attempts' read rates."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from typing import Any

import pytest
import slow_host_histories
from slow_host_histories import INTERVAL_MS, MB, Job, run_job
from speculation_histories import JobEvents, one_split_each, slow_finding, source

from tailguard.blocklist.fleet import FleetBlocklist
from tailguard.blocklist.policy import BlocklistTracker
from tailguard.detector.policy import SlowTaskDetector
from tailguard.detector.policy.slow_host import ReadHistory, SlowHostRule, median_without
from tailguard.model.config import FLIP_168, ConfigError, Settings
from tailguard.model.records import (
    AttemptDeploying,
    AttemptProgress,
    BlockNodes,
    LaunchSpeculativeAttempts,
    Record,
    SlowAttempt,
    SlowSubtask,
    SlowTasksDetected,
)

# Issue 24's setting in small: 6 one-slot hosts, 36 tasks of ~2 s, one host 5x slow.
FIVE_X = Job(host_factor=(1, 1, 1, 1, 1, 5), task_bytes=(10 * MB,) * 36, task_factor=(1,) * 36)


def test_a_uniformly_slow_host_is_found_on_its_third_report_blocked_and_its_attempt_copied():
    run = run_job(FIVE_X)
    first = run.first_report["h5"]
    # Reports at 0.5, 1.0 and 1.5 s: judged on the third, found at that report (before the
    # Tick that follows it).
    assert run.found("h5")[0] == first + 2 * INTERVAL_MS
    finding = next(f for f in run.findings if "h5" in f.slow_hosts)
    (cause,) = (e for e in run.events if e.id in finding.caused_by)
    assert (type(cause).__name__, cause.host) == ("AttemptProgress", "h5")
    assert {h for f in run.findings for h in f.slow_hosts} == {"h5"}
    at = run.found("h5")[0]
    blocks = [c for c in run.commands if isinstance(c, BlockNodes) and c.ts == at]
    assert [b.hosts for b in blocks] == [("h5",)]
    copies = [c for c in run.commands if isinstance(c, LaunchSpeculativeAttempts) and c.ts == at]
    assert [(c.subtask, c.avoid_hosts) for c in copies] == [(5, ("h5",))]


def test_a_slow_host_is_found_at_the_report_that_shows_it_not_at_the_next_tick():
    """Six hosts; h5's attempt deployed 400 ms after its peers, so it is judged (its third
    report) between two Ticks. The check runs at that report: the finding is caused by it and
    has its time. Reports that show no new slow host give nothing, and neither does h5's next
    one once it is found; the next Tick repeats the finding."""
    detector = SlowTaskDetector(Settings())
    ev = JobEvents()

    def out(record: Record) -> list[Record]:
        return detector.handle(record)

    for record in (
        ev.submitted((source("v", (10 * MB,) * 6),)),
        *(ev.node(f"h{i}") for i in range(6)),
        ev.initialized("v", one_split_each(6)),
        *(ev.deploying("v", s, 0, f"h{s}") for s in range(5)),
        ev.deploying("v", 5, 400, "h5"),
    ):
        assert out(record) == []

    # Peers read 4 MB/s and h5 0.8 MB/s from its start, each reporting every 250 ms; the Ticks
    # come with the peers' reports, h5's reports 150 ms after them.
    def h5_report(ts: int) -> Record:
        return ev.progress("v", 5, ts, 8 * (ts - 400) * MB // 10_000, 10 * MB, host="h5")

    for ts in (250, 500, 750, 1000):
        for s in range(5):
            assert out(ev.progress("v", s, ts, 4 * ts * MB // 1000, 10 * MB, host=f"h{s}")) == []
        assert not [f for f in out(ev.tick(ts)) if getattr(f, "slow_hosts", ())]
        if 400 < ts + 150 < 1000:
            assert out(h5_report(ts + 150)) == []  # fewer than three reports: not judged yet
    third = h5_report(1150)
    findings = out(third)
    assert [(f.ts, f.caused_by, f.slow_hosts) for f in findings] == [(1150, (third.id,), ("h5",))]
    assert out(h5_report(1400)) == []
    assert [f.slow_hosts for f in out(ev.tick(1500))] == [("h5",)]


def test_a_slow_host_that_read_its_input_at_once_is_found_once_it_runs_past_its_peers():
    # One batch per task (issue 24's I/O job): every report says "all read", so no rate shows;
    # but an attempt still running has a time per byte of at least (now - start) / total. At
    # 2.5x the finished attempts' 2 s it is as slow as a finished attempt could show: found at
    # 5 s, where it would finish at 10 s and Flink's rule would wait for 27 of 36 tasks.
    run = run_job(dataclasses.replace(FIVE_X, front_loaded=True))
    assert run.found("h5")[0] == 5_000
    assert {h for f in run.findings for h in f.slow_hosts} == {"h5"}
    assert "h5" in run.blocked()


def test_noise_in_a_job_that_reads_its_input_at_once_finds_nothing():
    noise = tuple(0.7 + 0.6 * ((7 * t) % 11) / 10 for t in range(36))  # 0.7 .. 1.3
    job = Job(
        host_factor=(1,) * 6, task_bytes=(10 * MB,) * 36, task_factor=noise, front_loaded=True
    )
    run = run_job(job)
    assert run.findings == [] and run.commands == []


def test_under_flip_168_the_same_host_is_not_found_before_three_quarters_finish():
    run = run_job(FIVE_X, FLIP_168)
    assert run.found("h5") == []
    # Flink's rule only looks once 27 of 36 tasks have finished (and after its 1 min bound).
    assert not [c for c in run.commands if isinstance(c, BlockNodes) and c.ts < 10_000]


def test_a_skewed_task_reading_at_the_usual_rate_is_not_a_slow_host():
    # Task 3 has 10x the data: it runs 10x longer on a healthy host, at the usual rate per byte.
    sizes = tuple(100 * MB if t == 3 else 10 * MB for t in range(24))
    run = run_job(Job(host_factor=(1,) * 6, task_bytes=sizes, task_factor=(1,) * 24))
    assert run.findings == [] and run.commands == []


def test_one_task_slow_by_its_own_data_beside_healthy_ones_does_not_condemn_its_host():
    # Two slots per host; task 8's data is 4x slower per byte than the others'. While it runs
    # on h0, h0's other slot finishes tasks at the usual rate: they outvote it.
    factor = tuple(4.0 if t == 8 else 1.0 for t in range(24))
    job = Job(host_factor=(1,) * 4, task_bytes=(10 * MB,) * 24, task_factor=factor, slots=2)
    run = run_job(job)
    assert all(f.slow_hosts == () for f in run.findings)
    assert run.blocked() == set()


def test_on_a_one_slot_host_such_a_task_is_taken_for_a_slow_host():
    # The limit of the rule (docs/policies/detector.md): with nothing else running there, one
    # attempt is all the evidence, and a task slow by its own data cannot be told from a node
    # that just turned slow. Its copy is made either way; the host is blocked for a while.
    factor = tuple(4.0 if t == 8 else 1.0 for t in range(24))
    run = run_job(Job(host_factor=(1,) * 6, task_bytes=(10 * MB,) * 24, task_factor=factor))
    assert run.blocked() == {"h2"}


def h3_slow_then(*later: Callable[[JobEvents], Record]) -> list[tuple[int, tuple[str, ...]]]:
    """Four attempts on h0-h3 and no progress report at all (tasks shorter than a report
    interval), so finished attempts are the only evidence: three peers finish at 2 s, h3's at
    10 s; then `later` (each given the job's event maker). When findings named a slow host."""
    detector = SlowTaskDetector(Settings())
    ev = JobEvents()
    out: list[Record] = []
    for record in (
        ev.submitted((source("v", (10 * MB,) * 8),)),
        *(ev.node(f"h{i}") for i in range(5)),
        ev.initialized("v", one_split_each(8)),
        *(ev.deploying("v", s, 0, f"h{s}") for s in range(4)),
        *(ev.finished("v", s, 2000, f"h{s}", input_bytes=10 * MB) for s in range(3)),
        ev.finished("v", 3, 10_000, "h3", input_bytes=10 * MB),
        *(make(ev) for make in later),
    ):
        out.extend(detector.handle(record))
    return [(f.ts, f.slow_hosts) for f in out if getattr(f, "slow_hosts", ())]


def test_a_finished_attempt_far_above_its_peers_is_evidence_against_its_host():
    # Found at the next Tick; past the memory (1 min) the finished attempt no longer counts.
    named = h3_slow_then(lambda ev: ev.tick(10_000), lambda ev: ev.tick(70_001))
    assert named == [(10_000, ("h3",))]


def test_attempts_at_par_on_a_host_outvote_its_earlier_slow_one():
    named = h3_slow_then(
        lambda ev: ev.deploying("v", 4, 10_000, "h3"),
        lambda ev: ev.finished("v", 4, 12_000, "h3", input_bytes=10 * MB),
        lambda ev: ev.deploying("v", 5, 12_000, "h3"),
        lambda ev: ev.finished("v", 5, 14_000, "h3", input_bytes=10 * MB),
        lambda ev: ev.tick(14_000),
    )
    assert named == []


def test_a_node_that_turns_slow_mid_job_is_found_within_three_reports_of_its_slow_attempt():
    job = Job(
        host_factor=(1,) * 6,
        task_bytes=(10 * MB,) * 60,
        task_factor=(1,) * 60,
        turns_slow_at=6_000,
        late_factor=5.0,
    )
    run = run_job(job)
    # h0 takes a task at 6 s (its third), at a fifth of the rate from then on.
    slow_start = min(e.ts for e in run.events if getattr(e, "host", None) == "h0" and e.ts >= 6000)
    assert run.found("h0") and run.found("h0")[0] <= slow_start + 3 * INTERVAL_MS
    assert run.blocked() == {"h0"}


# Tasks of 40 s (200 MB); h0 turns 5x slow 20 s into its first one.
LONG_TURNS = Job(
    host_factor=(1,) * 6,
    task_bytes=(200 * MB,) * 12,
    task_factor=(1,) * 12,
    turns_slow_at=20_000,
    late_factor=5.0,
)


@pytest.mark.parametrize("batch_mb", [None, 1])
def test_a_node_that_turns_slow_in_a_long_attempt_is_found_from_its_recent_reads(
    batch_mb: int | None,
) -> None:
    # Read byte by byte or in 1 MB batches (0.2 s each, two or three per report).
    job = dataclasses.replace(LONG_TURNS, batch_bytes=batch_mb and batch_mb * MB)
    run = run_job(job)
    # A window of 3 reports' worth of reads at the peers' pace, as min-reports gives the average:
    # found within 4 intervals, where the average since deploying needs the slow part to outweigh
    # the 20 s healthy one (at 2.5x its peers' time per byte: 50 s after the start, 30 s late).
    assert run.found("h0") and run.found("h0")[0] <= 20_000 + 4 * INTERVAL_MS
    assert {h for f in run.findings for h in f.slow_hosts} == {"h0"}
    average_only = run_job(job, {"slow-task-detector.slow-host.window": "0"})
    assert average_only.found("h0")[0] >= 45_000


def test_a_window_reads_a_batch_in_flight_in_the_attempts_favour():
    # Batches of 10 bytes every 100 ms, reported every 150 ms: a report lags the work by up to
    # a batch, so windows that end just before a batch lands would read up to 2x slower.
    history = ReadHistory(0)
    reports = [(t, 10 * (t // 100)) for t in range(150, 3001, 150)]
    for ts, read in reports:
        history.report(ts, read)
        recent = history.recent_per_byte(ts, read, span=300)
        # The true time per byte is 10 ms; no window may read slower than that.
        assert recent is None or recent <= 10.0
    assert history.grain == 10
    # Stalled from 3 s on: the windows that start before the stall grow with it.
    assert history.recent_per_byte(4_000, 300, span=300) == (4_000 - 3_000) / 10


# Six one-slot hosts, tasks of 2 s; each slot's first attempt waits 4 s for its worker to start
# (Python, its libraries, the JIT) before it reads. Hosts h0-h4 start at once; h5 joins at 6 s,
# when the others have finished three tasks each (Spark's dynamic allocation adding an executor,
# a worker that registered late).
LATE_JOINER = Job(
    host_factor=(1,) * 6,
    task_bytes=(10 * MB,) * 40,
    task_factor=(1,) * 40,
    joins_at=(0, 0, 0, 0, 0, 6_000),
    cold_start_ms=4_000,
)


@pytest.mark.parametrize("front_loaded", [False, True])
def test_a_late_joining_host_is_judged_against_cold_peers_not_warm_ones(front_loaded: bool) -> None:
    # h5's first attempt reads nothing for 4 s: 6 s for 2 s of reading, 3x the warm attempts'
    # time per byte, more than a 5x node shows at its third report. Against the first wave,
    # which paid the same start, it is at par: no verdict, no block. Front-loaded (its input
    # reported whole at once, as Spark reports a scan's), it is judged by its time so far
    # against the finished cold attempts'.
    run = run_job(dataclasses.replace(LATE_JOINER, front_loaded=front_loaded))
    assert all(f.slow_hosts == () for f in run.findings)
    assert run.blocked() == set()


def test_a_slow_host_that_joins_late_is_found_once_its_start_no_longer_hides_it():
    job = dataclasses.replace(
        LATE_JOINER,
        host_factor=(1, 1, 1, 1, 1, 5),
        task_bytes=(10 * MB,) * 80,
        task_factor=(1,) * 80,
    )
    run = run_job(job)
    deploys = [e.ts for e in run.events if isinstance(e, AttemptDeploying) and e.host == "h5"]
    # Its first attempt, 4 s of start and 10 s of reading, is 2.3x the cold attempts' 4 + 2 s
    # over the same input: under 2.5, as a healthy host's 4 s start is at par. Its second one,
    # warm, reads at 5x its warm peers' rate: found at its third report.
    assert len(deploys) >= 2
    found = run.found("h5")
    assert found and deploys[1] < found[0] <= deploys[1] + 3 * INTERVAL_MS
    assert {h for f in run.findings for h in f.slow_hosts} == {"h5"}


def test_a_moderately_slow_host_is_left_to_the_other_rules():
    # 1.5x slower: within what noise and start-up can do, so not a host verdict.
    job = Job(host_factor=(1, 1, 1, 1, 1, 1.5), task_bytes=(10 * MB,) * 36, task_factor=(1,) * 36)
    assert run_job(job).found("h5") == []


# Spark's view (attach mode): no size known before a task ends, a report per 2 s heartbeat; the
# bench-attach job's scan tasks of 4 s read their split as one batch (`mapInPandas`).
SPARK_5X = dataclasses.replace(
    FIVE_X, task_bytes=(20 * MB,) * 36, front_loaded=True, sizes_known=False, report_every=4
)


def test_a_slow_host_whose_spark_tasks_read_at_once_is_found_before_its_first_task_ends() -> None:
    # Its reads say nothing (all read at the first heartbeat), and its size is unknown, but it
    # has read what a finished task reads: its time per byte so far passes 2.5x theirs at 10 s,
    # half-way through its 20 s task. It gets no second task.
    run = run_job(SPARK_5X)
    assert run.found("h5")[0] == 10_000
    assert {h for f in run.findings for h in f.slow_hosts} == {"h5"}
    deploys = [e for e in run.events if isinstance(e, AttemptDeploying) and e.host == "h5"]
    assert len(deploys) == 1


def test_in_sparks_view_a_slow_host_whose_tasks_read_steadily_is_found_from_running_peers() -> None:
    # Tasks of 30 s that read as they go: at each heartbeat every one is still reading, so its
    # average is a rate and its running peers judge it. Found at its third heartbeat (6 s),
    # not once peers have finished (30 s); a task that read at once is found from finished
    # peers only, at 2.5x their time.
    job = dataclasses.replace(SPARK_5X, task_bytes=(100 * MB,) * 36, ms_per_mb=300.0)
    steady = run_job(dataclasses.replace(job, front_loaded=False))
    assert steady.found("h5")[0] == 6_000
    assert {h for f in steady.findings for h in f.slow_hosts} == {"h5"}
    assert run_job(job).found("h5")[0] == 76_000


def test_a_host_is_checked_at_a_report_at_most_once_between_two_checks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Tasks slow by their own data (3x, 5% of them) on 4-slot hosts: their reports open the
    # gate, and a host they do not condemn is not walked again at a report before the next
    # check, however many of its attempts report meanwhile.
    checks: list[tuple[int, str]] = []

    class Counting(SlowTaskDetector):
        def _check_on_evidence(self, trigger: AttemptProgress, job: Any) -> list[Record]:
            checks.append((trigger.ts, trigger.host))
            return super()._check_on_evidence(trigger, job)

    monkeypatch.setattr(slow_host_histories, "SlowTaskDetector", Counting)
    draw = random.Random(0)
    n = 600
    sizes = tuple(draw.randint(10, 20) * MB for _ in range(n))
    factor = tuple(3.0 if draw.random() < 0.05 else draw.uniform(0.8, 1.2) for _ in range(n))
    run_job(Job(host_factor=(1,) * 12, task_bytes=sizes, task_factor=factor, slots=4))
    # The simulator's reports of one interval share its time, and a Tick follows them.
    assert checks
    assert len(checks) == len(set(checks))


@pytest.mark.parametrize(
    "job",
    [
        # h6's 10 MB task read for 0.9 s and finished at 3 s; the heartbeat that showed its
        # last bytes came 1.8 s after they were read: held to it, it read 2.5x slower than its
        # running peers.
        Job(
            host_factor=(1.0,) * 7,
            task_bytes=(10, 22, 22, 22, 22, 22, 22, 22, 45, 56, 56, 17, 11, 22, 12, 10, 10, 10, 10),
            task_factor=(1.0,) * 11 + (1.25,) + (1.0,) * 7,
            slots=2,
        ),
        # h0's task got its last 0.4 MB just after one heartbeat and showed it at the next, while
        # its peers' reports were a heartbeat older: 2.5x them at its report.
        Job(
            host_factor=(1.0,) * 5,
            task_bytes=(10, 48, 48, 10, 27, 16) + (10,) * 14,
            task_factor=(1.0, 0.75, 0.75, 1.0, 1.0, 1.28125) + (1.0,) * 14,
            read_share=0.5,
        ),
    ],
    ids=["finished-before-its-heartbeat", "running-peers-a-heartbeat-older"],
)
def test_in_sparks_view_reads_that_end_between_heartbeats_are_not_held_to_the_heartbeat(
    job: Job,
) -> None:
    # Found by the noise property (4,000-6,000 examples): no noise beyond +-30%, tasks that
    # read for part of their time, a report every 2 s.
    spark = dataclasses.replace(
        job,
        task_bytes=tuple(b * MB for b in job.task_bytes),
        ms_per_mb=300.0,
        sizes_known=False,
        report_every=4,
        read_share=0.3 if job.read_share == 1.0 else job.read_share,
    )
    run = run_job(spark)
    assert [f.slow_hosts for f in run.findings if f.slow_hosts] == []
    assert run.blocked() == set()


def test_young_attempts_already_slow_do_not_outvote_their_hosts_judged_ones() -> None:
    # Spark's view with its default 10 s heartbeat (a report every 20 Ticks): a 16-slot host,
    # 5x slow, always has attempts younger than three reports. Counted for their host whatever
    # they read, they outvoted its judged slow attempts until 22 s; an attempt that already
    # reads at 2.5x its peers abstains, and the host is found at 15 s, when it would be
    # without any young vote.
    n = 12 * 16 * 6
    draw = random.Random(0)
    sizes = tuple(draw.randint(15, 25) * MB for _ in range(n))
    job = Job(
        host_factor=(5,) + (1,) * 5,
        task_bytes=sizes,
        task_factor=(1,) * n,
        slots=16,
        sizes_known=False,
        report_every=20,
    )
    run = run_job(job)
    assert run.found("h0")[0] <= 15_000
    assert {h for f in run.findings for h in f.slow_hosts} == {"h0"}


@pytest.mark.parametrize("front_loaded", [True, False])
def test_in_sparks_view_long_tasks_of_skewed_data_condemn_no_host(front_loaded: bool) -> None:
    # Two tasks with 16x the data on one 2-slot host, which is on the slow side of the noise
    # (1.25 against 0.75). Their sizes are unknown until they end, so their time says nothing
    # of their host; what they have read says they read at the usual pace (FLIP-168's rule
    # flags them, in plain time; the blocklist weighs them per byte read).
    job = Job(
        host_factor=(1.0, 1.0, 1.0, 1.25, 0.75, 0.75, 0.75),
        task_bytes=(10 * MB,) * 26 + (161 * MB,) * 2,
        task_factor=(1.0,) * 28,
        ms_per_mb=300.0,
        slots=2,
        front_loaded=front_loaded,
        sizes_known=False,
        report_every=4,
    )
    run = run_job(job)
    assert all(f.slow_hosts == () for f in run.findings)
    assert run.blocked() == set()


def _reads_then_processes(read_share: float, **kwargs: object) -> Job:
    """Six healthy hosts whose 30 s tasks read steadily for `read_share` of their time and then
    process what they read (an aggregation, a write), reading nothing more."""
    job = Job(
        host_factor=(1, 1, 1, 1, 1, 1),
        task_bytes=(100 * MB,) * 24,
        task_factor=(1,) * 24,
        ms_per_mb=300.0,
        report_every=4,
        read_share=read_share,
    )
    return dataclasses.replace(job, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("read_share", [0.3, 0.6])
@pytest.mark.parametrize("joins_at", [None, (0, 0, 0, 20_000, 20_000, 20_000)])
def test_in_sparks_view_tasks_that_process_after_reading_condemn_no_host(
    read_share: float, joins_at: tuple[int, ...] | None
) -> None:
    # A task whose reads have stopped is judged against finished peers, by windows that end
    # where its reads last grew (one running on into the processing would count time with no
    # reads as slow reading). The first tasks to finish (at 30 s, while the hosts that joined
    # at 20 s still read) are judged by their reading against those that still read.
    run = run_job(_reads_then_processes(read_share, sizes_known=False, joins_at=joins_at))
    assert all(f.slow_hosts == () for f in run.findings)
    assert run.blocked() == set()


@pytest.mark.parametrize(
    "job",
    [
        # No noise, sizes known, skew only: h0's 10 MB task reads for 0.9 s, processes until
        # 3 s and finishes while its three peers (28 MB) still read (hypothesis found it).
        Job(
            host_factor=(1.0,) * 4,
            task_bytes=(10 * MB,) + (28 * MB,) * 3 + (10 * MB,) * 4,
            task_factor=(1.0,) * 8,
            ms_per_mb=300.0,
            read_share=0.3,
        ),
        # Every first attempt has read all by 9 s and processes until 30 s, so no check after
        # 9 s judges any: the first to finish meets the reference of the check at 8.5 s.
        _reads_then_processes(0.3),
    ],
    ids=["peers-still-reading", "a-past-check"],
)
def test_a_finished_attempt_is_judged_by_its_reading_against_running_peers(job: Job) -> None:
    # Running peers' averages time their reading; a finished attempt's whole figure holds its
    # processing too (3.3x theirs here: found slow before). Its average while it read is the
    # like figure.
    run = run_job(job)
    assert all(f.slow_hosts == () for f in run.findings)
    assert run.blocked() == set()


def test_the_rule_needs_enough_peers_on_other_hosts():
    # Three hosts: two peers for the slow one, under min-peers 3.
    job = Job(host_factor=(1, 1, 5), task_bytes=(10 * MB,) * 3, task_factor=(1,) * 3)
    assert run_job(job).found("h2") == []
    assert run_job(job, {"slow-task-detector.slow-host.min-peers": "2"}).found("h2")


@pytest.mark.parametrize(
    ("key", "value"),
    [("slowdown", "1"), ("min-reports", "0"), ("min-peers", "0"), ("window", "-1")],
)
def test_bad_settings_are_refused_naming_the_key(key: str, value: str) -> None:
    config = {f"slow-task-detector.slow-host.{key}": value}
    with pytest.raises(ConfigError, match=key):
        SlowHostRule.from_settings(Settings(config))
    # A job with such a config is still watched, with the service's rule.
    detector = SlowTaskDetector(Settings())
    detector.handle(JobEvents().submitted((source("v", (1,)),), config=config))
    assert detector.metrics()["config_errors"] == 1


def test_median_without_equals_the_median_of_the_rest():
    values = sorted([5.0, 1.0, 1.0, 2.0, 9.0, 3.0, 3.0])
    assert median_without(values, [3.0, 9.0]) == 2.0  # 1 1 2 3 5
    assert median_without(values, [1.0]) == 3.0  # 1 2 3 3 5 9 -> (3 + 3) / 2
    assert median_without(values, [3.0]) == 2.5  # 1 1 2 3 5 9 -> (2 + 3) / 2
    assert median_without(values, values) is None


# ------------------------------------------------------------------ the blocklist's side


def _with_hosts(finding: SlowTasksDetected, slow_hosts: tuple[str, ...]) -> SlowTasksDetected:
    return dataclasses.replace(finding, slow_hosts=slow_hosts)


def test_a_host_found_slow_is_blocked_at_once_in_the_job_and_the_fleet():
    attempt = SlowSubtask(0, (SlowAttempt(0, "h1", 1500),), 0)
    one = slow_finding(attempt, ts=1500, finding_id="f1")
    # One slow subtask is not enough evidence (blocklist.min-slow-attempts = 2)...
    assert BlocklistTracker(Settings()).handle(one) == []
    assert [c for c in FleetBlocklist(Settings()).handle(one) if isinstance(c, BlockNodes)] == []
    # ...a host verdict is.
    found = _with_hosts(one, ("h1",))
    blocks = [c for c in BlocklistTracker(Settings()).handle(found) if isinstance(c, BlockNodes)]
    assert [(b.hosts, b.until_ts) for b in blocks] == [(("h1",), 1500 + 60_000)]
    fleet = [c for c in FleetBlocklist(Settings()).handle(found) if isinstance(c, BlockNodes)]
    assert [b.hosts for b in fleet] == [("h1",)]


def test_a_verdict_on_an_unregistered_host_blocks_nothing():
    found = _with_hosts(slow_finding(ts=1, finding_id="f"), ("elsewhere",))
    assert BlocklistTracker(Settings()).handle(found) == []
