"""The pure parts of `tailguard bench`: statistics, the physical limit, control-plane latencies
from a job's records, and the markdown tables. No Spark, no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from tailguard.model import records as r
from tailguard.model.percentile import percentile

# The parts a run's CPU is measured in (bench/cpu.py): the broker and the services, the
# workers' process trees, the driver JVM and its children (the attached relay).
CPU_PARTS = ("control_plane", "executors", "driver")

# ----------------------------------------------------------------- statistics


@dataclass(frozen=True)
class Spread:
    median: float
    low: float
    high: float
    n: int


def spread(values: Sequence[float]) -> Spread:
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    return Spread(percentile(ordered, 50.0), ordered[0], ordered[-1], len(ordered))


# ----------------------------------------------------------------- physical limit


@dataclass(frozen=True)
class StageWork:
    vertex: str
    work_s: float  # sum of the task durations, measured on a healthy cluster
    longest_s: float  # the longest task


def stage_work(records: Iterable[r.Record]) -> list[StageWork]:
    """Per vertex, in the order vertices started: the finished attempts' durations."""
    deploying: dict[tuple[str, int, int], int] = {}
    order: list[str] = []
    durations: dict[str, list[float]] = {}
    for rec in records:
        if isinstance(rec, r.AttemptDeploying):
            deploying[(rec.vertex, rec.subtask, rec.attempt)] = rec.ts
            if rec.vertex not in durations:
                order.append(rec.vertex)
                durations[rec.vertex] = []
        elif isinstance(rec, r.AttemptFinished):
            start = deploying.get((rec.vertex, rec.subtask, rec.attempt))
            if start is not None:
                durations[rec.vertex].append((rec.ts - start) / 1000.0)
    return [StageWork(v, sum(durations[v]), max(durations[v], default=0.0)) for v in order]


@dataclass(frozen=True)
class SlowSpan:
    """One host `factor` times slower from `start_s` to `end_s` (job seconds; inf: to the end).

    A healthy host does one second of work per second; this one `1/factor` inside the span."""

    factor: float
    start_s: float = 0.0
    end_s: float = math.inf

    @classmethod
    def of(
        cls, factor: float, slow_for_s: float | None = None, slow_after_s: float | None = None
    ) -> SlowSpan:
        start = slow_after_s or 0.0
        return cls(max(1.0, factor), start, math.inf if slow_for_s is None else start + slow_for_s)

    @property
    def lost(self) -> float:
        """The capacity the host loses per second inside the span."""
        return 1.0 - 1.0 / self.factor

    def overlap(self, t: float) -> float:
        """Seconds of [0, t] inside the span."""
        return max(0.0, min(t, self.end_s) - self.start_s)

    def capacity(self, t: float, slots: int) -> float:
        """Healthy-host seconds of work `slots` one-slot hosts, this one among them, do by t."""
        return slots * t - self.lost * self.overlap(t)

    def time_for(self, work_s: float, slots: int) -> float:
        """The inverse of `capacity`: when the hosts have done `work_s`."""
        if work_s <= slots * self.start_s:
            return work_s / slots
        slow_rate = slots - self.lost
        if math.isinf(self.end_s) or work_s <= self.capacity(self.end_s, slots):
            return self.start_s + (work_s - slots * self.start_s) / slow_rate
        return self.end_s + (work_s - self.capacity(self.end_s, slots)) / slots


def physical_limit(
    stages: Sequence[StageWork],
    slots: int,
    slow_factor: float,
    slow_for_s: float | None = None,
    slow_after_s: float | None = None,
) -> float:
    """A lower bound on the makespan with one of `slots` nodes `slow_factor` times slower from
    `slow_after_s` (None: the start) for `slow_for_s` seconds (None: to the end).

    Stages run one after the other (every edge is blocking). While the node is slow the cluster
    delivers `slots - 1 + 1/slow_factor` slot-seconds of healthy work per second, otherwise
    `slots`. A stage of total work W ends when the capacity integrated from its start reaches W,
    and not before its longest task could finish on a fast node. This is the list-scheduling
    lower bound: it lets work move freely between slots and ignores scheduling overheads.
    """
    span = SlowSpan.of(slow_factor, slow_for_s, slow_after_s)
    t = 0.0
    for stage in stages:
        done = span.time_for(span.capacity(t, slots) + stage.work_s, slots)
        t = max(done, t + stage.longest_s)
    return t


@dataclass(frozen=True)
class IoLimit:
    tasks_s: float  # the best schedule of the indivisible tasks: the physical limit
    fluid_s: float  # total work over capacity, bounded below by one task (work may split)


def io_limit(
    tasks: int,
    task_s: float,
    hosts: int,
    slow_factor: float = 1.0,
    slow_for_s: float | None = None,
    slow_after_s: float | None = None,
    stages: int = 1,
) -> IoLimit:
    """Lower bounds on the I/O job's work stages: `stages` stages one after the other, each of
    `tasks` tasks of `task_s` healthy-host seconds, on `hosts` one-slot hosts, one of them
    `slow_factor` times slower from `slow_after_s` (None: the start) for `slow_for_s` (None: to
    the end), no overhead at all.

    - `fluid_s`: total work over the capacity, `hosts - 1 + 1/factor` slot-seconds per second
      while slow, and never below `task_s` a stage (the critical path: one task on a healthy
      host).
    - `tasks_s`: tasks cannot be split, and a copy of a task (speculation) redoes it whole, so
      no schedule beats, stage by stage, the smallest t at which the hosts, each running tasks
      back to back from the stage's start, can have finished `tasks` of them: sum over hosts of
      floor(work done since the stage's start / task_s). This is the tighter bound and the one
      called the physical limit.
    The final aggregation (one task over tiny partial sums) is left out: both bounds are for
    the work stages only, and so a little under what any real run can reach.
    """
    if tasks < 1 or task_s <= 0 or hosts < 1 or stages < 1:
        raise ValueError("need at least one stage, one task of positive length and one host")
    span = SlowSpan.of(slow_factor, slow_for_s, slow_after_s)
    fluid = physical_limit(
        [StageWork(f"io-{k}", tasks * task_s, task_s) for k in range(stages)],
        hosts,
        span.factor,
        slow_for_s,
        slow_after_s,
    )
    # Per host, the slow one first, its own span (a one-slot "cluster").
    spans = [span] + [SlowSpan(1.0)] * (hosts - 1)
    t = 0.0
    for _ in range(stages):
        t = _stage_end(t, tasks, task_s, spans)
    return IoLimit(t, fluid)


def _stage_end(t0: float, tasks: int, task_s: float, spans: Sequence[SlowSpan]) -> float:
    """When `tasks` indivisible tasks started at t0 can all have finished on these hosts: the
    makespan is a moment at which some host completes its k-th task of the stage."""
    begun = [(h, h.capacity(t0, 1)) for h in spans]
    candidates = sorted(
        {h.time_for(b + k * task_s, 1) for h, b in begun for k in range(1, tasks + 1)}
    )
    for t in candidates:
        done = sum(math.floor((h.capacity(t, 1) - b) / task_s + 1e-9) for h, b in begun)
        if done >= tasks:
            return t
    raise AssertionError("unreachable: the healthy hosts alone finish every task")


# ----------------------------------------------------------------- Spark's own task record


@dataclass(frozen=True)
class SparkTask:
    """One task attempt as Spark's status store lists it (`TaskData`)."""

    stage: int
    stage_attempt: int
    index: int  # the partition: an original and its speculative copy share it
    status: str  # SUCCESS, KILLED, FAILED, RUNNING, ...
    speculative: bool
    host: str
    duration_s: float | None  # None: Spark has no duration for it (still running)


def lost_copy_s(tasks: Iterable[SparkTask]) -> float:
    """The extra work of duplicated tasks: the task-seconds of the attempts that were killed
    because another attempt of the same task (its speculative copy, or the original it was a
    copy of) succeeded. A kill with no successful twin (a job cancelled) is not a lost race."""
    listed = list(tasks)
    succeeded = {(t.stage, t.stage_attempt, t.index) for t in listed if t.status == "SUCCESS"}
    return sum(
        t.duration_s or 0.0
        for t in listed
        if t.status == "KILLED" and (t.stage, t.stage_attempt, t.index) in succeeded
    )


def lost_race_s(records: Iterable[r.Record]) -> float:
    """tailguard's extra work, from its archive, as `lost_copy_s` counts Spark's: the
    task-seconds of the attempts canceled because another attempt of their subtask won
    (`LOST_RACE`), each from its deploying to its cancel."""
    deploying: dict[tuple[str, int, int], int] = {}
    total_ms = 0
    for rec in records:
        if isinstance(rec, r.AttemptDeploying):
            deploying[(rec.vertex, rec.subtask, rec.attempt)] = rec.ts
        elif isinstance(rec, r.AttemptCanceled) and rec.reason is r.CancelReason.LOST_RACE:
            start = deploying.get((rec.vertex, rec.subtask, rec.attempt))
            if start is not None:
                total_ms += max(0, rec.ts - start)
    return total_ms / 1000.0


def skew_pieces(records: Iterable[r.Record]) -> int:
    """The pieces the decider cut skewed subpartitions into, over the job's applied
    `SetParallelism` commands (0: no subpartition split)."""
    applied = {e.command_id for e in records if isinstance(e, r.CommandApplied)}
    return sum(
        split.pieces
        for c in records
        if isinstance(c, r.SetParallelism) and c.id in applied
        for split in c.skew_splits
    )


def slow_host_finding_ms(
    records: Iterable[r.Record], host: str, since_ms: int | None = None
) -> float | None:
    """From when the slow host could first be judged to the first finding whose slow-host
    verdict names it; None: never named. That moment is its first progress report, or when it
    turned slow (`since_ms`, a node that turns slow mid-job) if that is later: its attempts
    running then have reported already, and report again only as they read more."""
    first_report: int | None = None
    for rec in records:
        if first_report is None and isinstance(rec, r.AttemptProgress) and rec.host == host:
            first_report = rec.ts
        elif (
            first_report is not None
            and isinstance(rec, r.SlowTasksDetected)
            and host in rec.slow_hosts
        ):
            return float(rec.ts - max(first_report, since_ms or first_report))
    return None


def spark_stage_work(tasks: Iterable[SparkTask]) -> list[StageWork]:
    """Per stage, in stage order: the successful tasks' summed and longest durations."""
    durations: dict[int, list[float]] = {}
    for t in tasks:
        mine = durations.setdefault(t.stage, [])
        if t.status == "SUCCESS" and t.duration_s is not None:
            mine.append(t.duration_s)
    return [
        StageWork(f"stage-{stage}", sum(d), max(d, default=0.0))
        for stage, d in sorted(durations.items())
    ]


# ----------------------------------------------------------------- dispatch overhead

DISPATCH_P50_GOAL_MS = 5.0
DISPATCH_P99_GOAL_MS = 20.0


def dispatch_line(dispatch_ms: Sequence[float]) -> str:
    """The one-line figure of `make bench-agent`: `dispatch p50 N ms p99 N ms`."""
    if not dispatch_ms:
        return "dispatch p50 – ms p99 – ms (no attempt measured)"
    return (
        f"dispatch p50 {percentile(dispatch_ms, 50):.1f} ms "
        f"p99 {percentile(dispatch_ms, 99):.1f} ms"
    )


def dispatch_goals(dispatch_ms: Sequence[float]) -> list[str]:
    """The issue's targets for the dispatch overhead, met or not."""
    if not dispatch_ms:
        return ["dispatch overhead: no attempt measured (the runtime reports no dispatch_ms)"]
    p50, p99 = percentile(dispatch_ms, 50), percentile(dispatch_ms, 99)
    return [
        f"dispatch overhead p50 {p50:.1f} ms (goal ≤ {DISPATCH_P50_GOAL_MS:g}: "
        f"{'met' if p50 <= DISPATCH_P50_GOAL_MS else 'NOT met'}), p99 {p99:.1f} ms "
        f"(goal ≤ {DISPATCH_P99_GOAL_MS:g}: {'met' if p99 <= DISPATCH_P99_GOAL_MS else 'NOT met'}),"
        f" over {len(dispatch_ms)} attempts"
    ]


# ----------------------------------------------------------------- control-plane latencies


@dataclass(frozen=True)
class SpeculationLatency:
    vertex: str
    subtask: int
    qualified_ms: int  # ts of the Tick at which the attempt first qualified as slow
    applied_ms: int | None  # the agent applied the launch command
    deploying_ms: int | None  # the speculative attempt was deployed
    answered_ms: int | None = None  # the agent applied or rejected the command

    @property
    def to_answered_ms(self) -> int | None:
        return None if self.answered_ms is None else self.answered_ms - self.qualified_ms

    @property
    def to_applied_ms(self) -> int | None:
        return None if self.applied_ms is None else self.applied_ms - self.qualified_ms

    @property
    def to_deploying_ms(self) -> int | None:
        return None if self.deploying_ms is None else self.deploying_ms - self.qualified_ms


def _slow_attempts(finding: r.SlowTasksDetected, subtask: int) -> frozenset[int] | None:
    for slow in finding.slow:
        if slow.subtask == subtask:
            return frozenset(a.attempt for a in slow.live_attempts if a.slow)
    return None


def speculation_latencies(records: Iterable[r.Record]) -> list[SpeculationLatency]:
    """For each `LaunchSpeculativeAttempts`: from the Tick at which its slow attempt first
    qualified (the `caused_by` Tick of the first finding that named the same slow attempts) to
    the command applied and to the speculative `AttemptDeploying` it led to."""
    ticks: dict[str, int] = {}
    findings: dict[str, r.SlowTasksDetected] = {}
    finding_order: list[r.SlowTasksDetected] = []
    launches: list[r.LaunchSpeculativeAttempts] = []
    applied: dict[str, int] = {}
    answered: dict[str, int] = {}
    deploying: dict[str, int] = {}
    for rec in records:
        if isinstance(rec, r.Tick):
            ticks[rec.id] = rec.ts
        elif isinstance(rec, r.SlowTasksDetected):
            findings[rec.id] = rec
            finding_order.append(rec)
        elif isinstance(rec, r.LaunchSpeculativeAttempts):
            launches.append(rec)
        elif isinstance(rec, r.CommandApplied):
            applied.setdefault(rec.command_id, rec.ts)
            answered.setdefault(rec.command_id, rec.ts)
        elif isinstance(rec, r.CommandRejected):
            answered.setdefault(rec.command_id, rec.ts)
        elif isinstance(rec, r.AttemptDeploying) and rec.speculative and rec.command_id:
            deploying.setdefault(rec.command_id, rec.ts)

    def tick_ts(finding: r.SlowTasksDetected) -> int:
        return min((ticks[c] for c in finding.caused_by if c in ticks), default=finding.ts)

    out: list[SpeculationLatency] = []
    for launch in launches:
        cause = next((findings[c] for c in launch.caused_by if c in findings), None)
        if cause is None:
            continue
        slow = _slow_attempts(cause, launch.subtask)
        first = cause
        for finding in finding_order:
            if (
                finding.vertex == launch.vertex
                and tick_ts(finding) <= tick_ts(cause)
                and _slow_attempts(finding, launch.subtask) == slow
            ):
                first = finding
                break
        out.append(
            SpeculationLatency(
                launch.vertex,
                launch.subtask,
                tick_ts(first),
                applied.get(launch.id),
                deploying.get(launch.id),
                answered.get(launch.id),
            )
        )
    return out


def decider_latencies(records: Iterable[r.Record]) -> list[tuple[str, int]]:
    """(vertex, ms) for each vertex initialised by the decider once its inputs finished: from
    the last `AttemptFinished` of its input vertices to its `VertexInitialized`."""
    inputs: dict[str, set[str]] = {}
    last_finished: dict[str, int] = {}
    out: list[tuple[str, int]] = []
    for rec in records:
        if isinstance(rec, r.JobSubmitted):
            for edge in rec.graph.edges:
                inputs.setdefault(edge.target, set()).add(edge.source)
        elif isinstance(rec, r.AttemptFinished):
            last_finished[rec.vertex] = max(rec.ts, last_finished.get(rec.vertex, rec.ts))
        elif isinstance(rec, r.VertexInitialized) and rec.decided_by == "decider":
            producers = inputs.get(rec.vertex, set())
            if producers and all(p in last_finished for p in producers):
                out.append((rec.vertex, rec.ts - max(last_finished[p] for p in producers)))
    return out


def speculated_subtasks(records: Iterable[r.Record]) -> set[tuple[str, int]]:
    return {
        (rec.vertex, rec.subtask) for rec in records if isinstance(rec, r.LaunchSpeculativeAttempts)
    }


def largest_input_subtask(records: Iterable[r.Record], vertex: str) -> tuple[int, int] | None:
    """(subtask, input bytes) of `vertex`'s subtask with the most input bytes."""
    best: tuple[int, int] | None = None
    for rec in records:
        if (
            isinstance(rec, r.AttemptFinished)
            and rec.vertex == vertex
            and rec.input_bytes
            and (best is None or rec.input_bytes > best[1])
        ):
            best = (rec.subtask, rec.input_bytes)
    return best


# ----------------------------------------------------------------- tables


def fmt_s(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def fmt_ratio(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}×"


@dataclass(frozen=True)
class Row:
    contender: str
    times_s: Sequence[float]
    speculative: Sequence[int | None] = ()
    blocked: Sequence[int | None] = ()
    failed: int = 0
    load: Sequence[float] = ()  # the 1-minute load average at the end of each run
    lost_copy_s: Sequence[float | None] = ()  # per run: task-seconds of copies that lost
    # Per run: CPU seconds of the job per part (CPU_PARTS, as bench.cpu samples them), if measured.
    cpu_s: Sequence[Mapping[str, float] | None] = ()


def _mean_count(values: Sequence[int | None]) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "–"
    return f"{sum(known) / len(known):.1f}"


def _median_s(values: Sequence[float | None]) -> str:
    known = [v for v in values if v is not None]
    return fmt_s(spread(known).median) if known else "–"


def _median_cpu(runs: Sequence[Mapping[str, float] | None]) -> str:
    """Median CPU seconds per part over the runs that measured them: "control plane /
    executors / driver"."""
    known = [r for r in runs if r]
    if not known:
        return "–"
    return " / ".join(f"{spread([r[part] for r in known]).median:.1f}" for part in CPU_PARTS)


def scenario_table(
    rows: Sequence[Row], reference: str | None, extra: Mapping[str, float | None]
) -> str:
    """One markdown table: median and min–max per contender, and the ratio to `reference`
    (a contender's name); `extra` adds lines such as the ideal and the physical limit."""
    medians = {row.contender: spread(row.times_s).median for row in rows if row.times_s}
    ref = medians.get(reference) if reference else None
    lines = [
        "| contender | median s | min–max s | runs | vs best plain | speculative attempts "
        "| lost copies task-s | blocked hosts | CPU s: control plane / executors / driver "
        "| load 1 min per run |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        load = ", ".join(f"{v:.1f}" for v in row.load) or "–"
        if not row.times_s:
            lines.append(
                f"| {row.contender} | – | – | 0 (failed {row.failed}) | – | – | – | – | – "
                f"| {load} |"
            )
            continue
        s = spread(row.times_s)
        ratio = s.median / ref if ref else None
        runs = f"{s.n}" + (f" (+{row.failed} failed)" if row.failed else "")
        lines.append(
            f"| {row.contender} | {s.median:.1f} | {s.low:.1f}–{s.high:.1f} | {runs} "
            f"| {fmt_ratio(ratio)} | {_mean_count(row.speculative)} "
            f"| {_median_s(row.lost_copy_s)} | {_mean_count(row.blocked)} "
            f"| {_median_cpu(row.cpu_s)} | {load} |"
        )
    for label, value in extra.items():
        lines.append(f"| *{label}* | {fmt_s(value)} | | | | | | | | |")
    return "\n".join(lines)


def relay_to_outcome_line(ms: Sequence[float]) -> str:
    """Attach mode: a command from reaching the relay to Spark's answer."""
    if not ms:
        return "command at the relay → Spark's answer: no command"
    return (
        f"command at the relay → Spark's answer p50 {percentile(ms, 50):.1f} ms, "
        f"p99 {percentile(ms, 99):.1f} ms over {len(ms)} commands"
    )


def latency_table(named: Mapping[str, Sequence[float]]) -> str:
    """p50/p99/max per latency; sub-10 ms figures keep a decimal (dispatch is ~1 ms)."""

    def ms(value: float) -> str:
        return f"{value:.1f}" if abs(value) < 10 else f"{value:.0f}"

    lines = ["| latency | samples | p50 ms | p99 ms | max ms |", "|---|---:|---:|---:|---:|"]
    for label, values in named.items():
        if values:
            lines.append(
                f"| {label} | {len(values)} | {ms(percentile(values, 50))} "
                f"| {ms(percentile(values, 99))} | {ms(max(values))} |"
            )
        else:
            lines.append(f"| {label} | 0 | – | – | – |")
    return "\n".join(lines)
