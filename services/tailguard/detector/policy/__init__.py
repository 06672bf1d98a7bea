"""Slow task detection (Flink 2.1's ExecutionTimeBasedSlowTaskDetector), as a pure core.

Events in, findings out. On every `Tick` each initialised vertex whose finished subtasks are at
least R of its N (`finished / N >= R`, as a double) gets a baseline. K = Math.round(N·R); the K
finished attempts with the smallest execution time per input byte are sorted and the one at
index K/2 (integer division) is the baseline element; the baseline is its time × M, rounded down
(Java's (long) cast), per that element's input bytes. A live (deploying or running) attempt is
slow when it has run for at least the lower bound B and its time per assigned input byte
reaches the baseline's. Sizes as Flink's `ExecutionTimeWithInputBytes` takes them: time /
max(bytes, Double.MIN_VALUE), so an input of 0 bytes is the smallest positive size, not
"unknown"; when the bytes are unknown, plain times are compared instead. K = 0 (a ratio of 0)
gives a 0 baseline: every live attempt past B is slow.

Execution time, as FLIP-168 defines it: finish − deploying for a finished attempt, now −
deploying for a live one, 0 for a failed or cancelled one (so those are never slow and never in
the baseline). A `Tick` triggers a check, and so does a progress report that gives a host not yet
found slow enough evidence for the slow-host rule (`_check_on_evidence`): every decision
happens at a logged instant, the time of the event that triggered it.

Work per Tick does not grow with the finished attempts: the baseline elements are kept
incrementally as attempts finish (`BaselineElement`), assigned input bytes are cached per
subtask, and a Tick walks the live attempts oldest first and stops at the first one younger
than B (none after it can be slow), so it touches only the live attempts that have run for at
least B, plus one.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

from tailguard.detector.policy.inputs import ProducerOutputs, assigned_bytes, split_prefix_sums
from tailguard.detector.policy.median import BaselineElement
from tailguard.detector.policy.progress import (
    Progress,
    ProgressRule,
    RunningMedian,
    corroborated,
    is_slow,
    reference_per_byte,
    time_left_ms,
)
from tailguard.detector.policy.slow_host import (
    ReadHistory,
    SlowHostRule,
    found_slow,
    median_of_sorted,
    median_without,
    slowdown,
)
from tailguard.model.config import ConfigError, Settings
from tailguard.model.ids import derived_id
from tailguard.model.records import (
    AttemptCanceled,
    AttemptDeploying,
    AttemptFailed,
    AttemptFinished,
    AttemptProgress,
    InputRange,
    JobFinished,
    JobSubmitted,
    NodeAdded,
    NodeRemoved,
    Record,
    SlowAttempt,
    SlowSubtask,
    SlowTasksDetected,
    SpeculativeAttemptWon,
    Tick,
    VertexInitialized,
    VertexSpec,
)

__all__ = ["SlowTaskDetector", "time_per_byte"]

_NS_PER_MS = 1_000_000
# What a check runs at: the agent's Tick, or the progress report that shows a host slow.
_Trigger = Tick | AttemptProgress
_ReadingKind = Literal["none", "drained", "young", "stopped", "judged"]
# Java's Double.MIN_VALUE: Flink divides by max(input bytes, this), so 0 bytes is the smallest
# positive size (a positive time over it is +inf), not "unknown".
_MIN_BYTES = 5e-324


def time_per_byte(execution_ms: int, input_bytes: int) -> float:
    """`ExecutionTimeWithInputBytes.compareTo`'s key: time / max(bytes, Double.MIN_VALUE)."""
    return execution_ms / max(input_bytes, _MIN_BYTES)


@dataclass(frozen=True, slots=True)
class _Rule:
    ratio: float
    multiplier: float
    lower_bound_ms: int
    progress: ProgressRule
    slow_host: SlowHostRule

    @classmethod
    def from_settings(cls, settings: Settings) -> _Rule:
        return cls(
            progress=ProgressRule.from_settings(settings),
            slow_host=SlowHostRule.from_settings(settings),
            ratio=settings.number("slow-task-detector.execution-time.baseline-ratio"),
            multiplier=settings.number("slow-task-detector.execution-time.baseline-multiplier"),
            lower_bound_ms=settings.duration_ms(
                "slow-task-detector.execution-time.baseline-lower-bound"
            ),
        )


@dataclass(frozen=True, slots=True)
class _Judged:
    """A running attempt the slow-host rule judges: its time per byte since deploying, and its
    input's size when known."""

    live: _LiveAttempt
    per_byte: float
    total: int | None


@dataclass(slots=True)
class _Evidence:
    """What the slow-host rule gathers in one check: per host its slowdowns, the vertex of its
    latest piece, and when its oldest judged running attempt started."""

    vertex: str
    slowdowns: dict[str, list[float]]
    where: dict[str, str]
    oldest: dict[str, int]

    def add(self, live: _LiveAttempt, ratio: float | None) -> None:
        if ratio is None:
            return
        self.slowdowns.setdefault(live.host, []).append(ratio)
        self.where[live.host] = self.vertex
        self.judged(live)

    def judged(self, live: _LiveAttempt) -> None:
        """The host has this attempt running, judged: what it finished before it started is
        no evidence any more."""
        started = live.deploying_ts
        self.oldest[live.host] = min(started, self.oldest.get(live.host, started))


@dataclass(slots=True)
class _LiveAttempt:
    attempt: int
    host: str
    speculative: bool
    deploying_ts: int
    # The last AttemptProgress, for the progress-rate and slow-host rules.
    progress: Progress | None = None
    # Reports with bytes read: the slow-host rule judges an attempt from `min-reports` of them.
    reports: int = 0
    # Where its reads grew, for the slow-host rule's recent window (made on the first report).
    history: ReadHistory | None = None
    # Deployed on a host that had finished no attempt of the job yet: it pays the host's start
    # (a worker's first task starts its Python process, loads its libraries, warms the JIT), so
    # the slow-host rule compares it with attempts that paid it too.
    cold: bool = False


class _VertexState:
    __slots__ = (
        "assigned",
        "done",
        "finished",
        "finished_cold_per_byte",
        "finished_input",
        "finished_per_byte",
        "inputs",
        "k",
        "latest_attempt",
        "live",
        "live_by_age",
        "outputs",
        "parallelism",
        "per_byte",
        "plain",
        "reported_slow",
        "reporting",
        "running_cold_reference",
        "running_reference",
        "spec",
        "split_prefix",
    )

    def __init__(self, spec: VertexSpec) -> None:
        self.spec = spec
        self.parallelism: int | None = None
        self.inputs: dict[int, tuple[InputRange, ...]] = {}
        self.split_prefix = split_prefix_sums(spec.split_bytes)
        self.outputs = ProducerOutputs()
        # subtask -> attempt number -> live attempt; the only thing a Tick iterates.
        self.live: dict[int, dict[int, _LiveAttempt]] = {}
        # The same live attempts in deploying order (a job's events are in time order), which
        # is all a Tick walks.
        self.live_by_age: dict[tuple[int, int], _LiveAttempt] = {}
        # The live attempts that have reported bytes read, in their first report's order: all
        # the slow-host rule walks (a job whose runners report nothing costs it nothing).
        self.reporting: dict[tuple[int, int], _LiveAttempt] = {}
        self.latest_attempt: dict[int, int] = {}
        # Subtasks that have finished at least once: the R·N condition.
        self.finished: set[int] = set()
        # Subtasks whose current run has a finished attempt: their other attempts are about to
        # be cancelled and are not checked (a restart deploys a new attempt and clears this).
        self.done: set[int] = set()
        # Known assigned input bytes per subtask (inputs never change once initialised).
        self.assigned: dict[int, int] = {}
        # Every finished attempt's time per byte, for the progress-rate rule's reference.
        self.finished_per_byte = RunningMedian()
        # ...and of those that were cold (`_LiveAttempt.cold`): a cold attempt's reference.
        self.finished_cold_per_byte = RunningMedian()
        # ...and their input bytes: what a whole input of this vertex is, when a running
        # attempt's own is not known (Spark's tasks, `_unsized_slowdown`).
        self.finished_input = RunningMedian()
        self.k = 0
        self.plain: BaselineElement | None = None
        self.per_byte: BaselineElement | None = None
        self.reported_slow = False
        # The slow-host rule's median time per byte of the judged running attempts at the last
        # check, and how many: a finished attempt's reference while few have finished, and the
        # gate of a check on a report (`_may_find_host`).
        self.running_reference: tuple[float, int] | None = None
        # The same over the cold judged running attempts only.
        self.running_cold_reference: tuple[float, int] | None = None

    def initialise(self, event: VertexInitialized, rule: _Rule) -> None:
        n = event.parallelism
        self.parallelism = n
        self.inputs = {s.subtask: s.inputs for s in event.subtask_inputs}
        self.assigned.clear()
        # K = Math.round(N·R) (half up), as Flink computes the baseline count. K = 0 (a ratio
        # of 0) gives a 0 baseline: every live attempt past the lower bound is slow.
        k = min(n, math.floor(n * rule.ratio + 0.5))
        if self.plain is None or self.k != k:
            self.k = k
            self.plain = BaselineElement(k) if k else None
            self.per_byte = BaselineElement(k) if k else None


class _JobState:
    __slots__ = (
        "finished_evidence",
        "hosts",
        "last_finished_slowdown",
        "not_found_since_check",
        "rule",
        "slow_hosts",
        "sorted_hosts",
        "vertices",
        "warm_hosts",
    )

    def __init__(self, event: JobSubmitted, rule: _Rule) -> None:
        self.rule = rule
        self.vertices = {spec.name: _VertexState(spec) for spec in event.graph.vertices}
        self.hosts: set[str] = set()
        self.sorted_hosts: tuple[str, ...] | None = ()
        # Per host, its last finished attempt's time per byte over the median of its vertex's
        # finished ones then: the progress rule's host corroboration between running attempts.
        self.last_finished_slowdown: dict[str, float] = {}
        # Per host, (finish ts, slowdown per byte, vertex) of its finished attempts within the
        # slow-host rule's memory, oldest first: evidence for or against the host.
        self.finished_evidence: dict[str, deque[tuple[int, float, str]]] = {}
        # Hosts that have finished an attempt of the job: an attempt deployed elsewhere is cold.
        self.warm_hosts: set[str] = set()
        # The slow-host rule's verdict at the last check: a host in it is not checked for
        # again when new evidence against it arrives (the next Tick repeats the finding).
        self.slow_hosts: frozenset[str] = frozenset()
        # Hosts a report's check did not find slow since the last check (`_may_find_host`).
        self.not_found_since_check: set[str] = set()

    def host_list(self) -> tuple[str, ...]:
        if self.sorted_hosts is None:
            self.sorted_hosts = tuple(sorted(self.hosts))
        return self.sorted_hosts


class SlowTaskDetector:
    SERVICE: ClassVar[str] = "detector"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._jobs: dict[str, _JobState] = {}
        self._findings = 0
        self._attempts_examined = 0
        self._speculative_wins = 0
        self._config_errors = 0
        self._default_rule = _Rule.from_settings(settings)

    # ------------------------------------------------------------------ dispatch

    def handle(self, record: Record) -> list[Record]:
        if isinstance(record, JobSubmitted):
            if record.job_id not in self._jobs:
                self._jobs[record.job_id] = _JobState(record, self._job_rule(record))
            return []
        job = self._jobs.get(record.job_id)
        if job is None:
            return []
        if isinstance(record, Tick):
            return self._check(record, job)
        if isinstance(record, AttemptProgress):
            vertex = self._subtask_vertex(job, record.vertex, record.subtask)
            live = (
                None if vertex is None else vertex.live.get(record.subtask, {}).get(record.attempt)
            )
            if vertex is not None and live is not None:
                live.progress = Progress(record.ts, record.bytes_read, record.bytes_total)
                if job.rule.slow_host.enabled:
                    if live.history is None:
                        live.history = ReadHistory(live.deploying_ts)
                    live.history.report(record.ts, record.bytes_read)
                if record.bytes_read > 0:
                    live.reports += 1
                    vertex.reporting[(record.subtask, record.attempt)] = live
                    if job.rule.slow_host.enabled and self._may_find_host(
                        job, vertex, record.subtask, live
                    ):
                        return self._check_on_evidence(record, job)
            return []
        if isinstance(record, AttemptDeploying | AttemptFinished | AttemptFailed | AttemptCanceled):
            vertex = self._subtask_vertex(job, record.vertex, record.subtask)
            if vertex is None:
                return []
            if isinstance(record, AttemptDeploying):
                self._deploying(record, vertex, cold=record.host not in job.warm_hosts)
            elif isinstance(record, AttemptFinished):
                return self._finished(record, job, vertex)
            else:
                self._pop_live(vertex, record.subtask, record.attempt)
        elif isinstance(record, VertexInitialized):
            vertex = job.vertices.get(record.vertex)
            if vertex is not None and record.parallelism > 0:
                vertex.initialise(record, job.rule)
        elif isinstance(record, NodeAdded):
            job.hosts.add(record.host)
            job.sorted_hosts = None
        elif isinstance(record, NodeRemoved):
            job.hosts.discard(record.host)
            job.sorted_hosts = None
        elif isinstance(record, JobFinished):
            return self._job_finished(record, job)
        return []

    def _job_rule(self, event: JobSubmitted) -> _Rule:
        """The job's own thresholds; the service's when the job's cannot be parsed (a job with
        a typo in its config is still watched rather than crashing the service)."""
        try:
            return _Rule.from_settings(self.settings.for_job(event.config))
        except ConfigError:
            self._config_errors += 1
            return self._default_rule

    def metrics(self) -> dict[str, float]:
        slow_vertices = sum(
            1 for job in self._jobs.values() for v in job.vertices.values() if v.reported_slow
        )
        return {
            "jobs": float(len(self._jobs)),
            "findings_emitted": float(self._findings),
            "slow_vertices": float(slow_vertices),
            "speculative_wins": float(self._speculative_wins),
            "config_errors": float(self._config_errors),
            # Live attempts walked by checks (Ticks, and reports that may show a slow host):
            # what a check's cost is proportional to.
            "attempts_examined": float(self._attempts_examined),
        }

    # ------------------------------------------------------------------ attempt lifecycle

    @staticmethod
    def _subtask_vertex(job: _JobState, name: str, subtask: int) -> _VertexState | None:
        """The vertex, if it is initialised and has this subtask (else the event is ignored)."""
        vertex = job.vertices.get(name)
        if vertex is None or vertex.parallelism is None or not 0 <= subtask < vertex.parallelism:
            return None
        return vertex

    def _deploying(self, event: AttemptDeploying, vertex: _VertexState, cold: bool) -> None:
        live = _LiveAttempt(event.attempt, event.host, event.speculative, event.ts, cold=cold)
        vertex.live.setdefault(event.subtask, {})[event.attempt] = live
        vertex.live_by_age.pop((event.subtask, event.attempt), None)  # a repeat moves to the end
        vertex.reporting.pop((event.subtask, event.attempt), None)  # ...and starts unreported
        vertex.live_by_age[(event.subtask, event.attempt)] = live
        previous = vertex.latest_attempt.get(event.subtask, event.attempt)
        vertex.latest_attempt[event.subtask] = max(previous, event.attempt)
        if not event.speculative:
            # A restart runs the subtask again; a late mirror of a finished one does not.
            vertex.done.discard(event.subtask)

    @staticmethod
    def _pop_live(vertex: _VertexState, subtask: int, attempt: int) -> _LiveAttempt | None:
        attempts = vertex.live.get(subtask)
        if attempts is None:
            return None
        live = attempts.pop(attempt, None)
        if not attempts:
            del vertex.live[subtask]
        vertex.live_by_age.pop((subtask, attempt), None)
        vertex.reporting.pop((subtask, attempt), None)
        return live

    def _finished(
        self, event: AttemptFinished, job: _JobState, vertex: _VertexState
    ) -> list[Record]:
        live = self._pop_live(vertex, event.subtask, event.attempt)
        job.warm_hosts.add(event.host)
        won = event.subtask not in vertex.done
        vertex.done.add(event.subtask)
        vertex.finished.add(event.subtask)
        vertex.outputs.record(event.subtask, event.bytes_per_subpartition)
        if live is None:
            return []
        execution_ms = event.ts - live.deploying_ts
        if vertex.plain is not None and vertex.per_byte is not None:
            size = event.input_bytes
            if size is None:
                size = self._assigned(job, vertex, event.subtask)
            vertex.plain.add(execution_ms, event.subtask, (execution_ms, size))
            if size is not None:
                key = time_per_byte(execution_ms, size)
                vertex.per_byte.add(key, event.subtask, (execution_ms, size))
                if size > 0:
                    median = vertex.finished_per_byte.median()
                    if median:
                        job.last_finished_slowdown[live.host] = execution_ms / size / median
                    if job.rule.slow_host.enabled:
                        self._finished_evidence(event, job, vertex, execution_ms / size, live)
                    vertex.finished_per_byte.add(execution_ms / size)
                    vertex.finished_input.add(size)
                    if live.cold:
                        vertex.finished_cold_per_byte.add(execution_ms / size)
        if not (won and live.speculative):
            return []
        self._speculative_wins += 1
        return [
            SpeculativeAttemptWon(
                job_id=event.job_id,
                ts=event.ts,
                id=derived_id(self.SERVICE, event.id),
                caused_by=(event.id,),
                vertex=event.vertex,
                subtask=event.subtask,
                attempt=event.attempt,
                host=event.host,
            )
        ]

    @staticmethod
    def _finished_evidence(
        event: AttemptFinished,
        job: _JobState,
        vertex: _VertexState,
        per_byte: float,
        live: _LiveAttempt,
    ) -> None:
        """A finished attempt's slowdown per byte against its vertex's finished attempts (or,
        while fewer than `min-peers` have finished, the running ones of the last check, by its
        own average while it read): a finished attempt far above its peers is evidence against
        its host, one at par for it. A cold attempt is compared with the cold ones only."""
        rule = job.rule.slow_host
        cold = live.cold
        finished = vertex.finished_cold_per_byte if cold else vertex.finished_per_byte
        running = vertex.running_cold_reference if cold else vertex.running_reference
        reference = None
        if len(finished) >= rule.min_peers:
            reference = finished.median()
        elif running is not None and running[1] >= rule.min_peers:
            reference = running[0]
            # Running peers' averages time their reading so far; this attempt's like figure is
            # its own average while it read, not its whole one, which holds what it did after
            # its reads (an aggregation, a write): 3.3x its peers' for tasks that read for 30%
            # of their time, without any noise.
            reading = live.history.reading_per_byte() if live.history is not None else None
            if reading is None:
                return  # a single read: nothing like its peers' averages to compare
            per_byte = min(per_byte, reading)
        ratio = None if reference is None else slowdown(per_byte, reference)
        if ratio is not None:
            seen = job.finished_evidence.setdefault(event.host, deque())
            seen.append((event.ts, ratio, event.vertex))

    def _assigned(self, job: _JobState, vertex: _VertexState, subtask: int) -> int | None:
        known = vertex.assigned.get(subtask)
        if known is not None:
            return known
        ranges = vertex.inputs.get(subtask)
        if ranges is None:
            return None
        size = assigned_bytes(
            ranges,
            vertex.split_prefix,
            {r.input: job.vertices[r.input].outputs for r in ranges if r.input in job.vertices},
            {
                r.input: p
                for r in ranges
                if r.input in job.vertices and (p := job.vertices[r.input].parallelism) is not None
            },
        )
        if size is not None:
            vertex.assigned[subtask] = size
        return size

    # ------------------------------------------------------------------ the check

    def _may_find_host(
        self, job: _JobState, vertex: _VertexState, subtask: int, live: _LiveAttempt
    ) -> bool:
        """Whether a report makes its attempt, on a host not found slow, slow enough against its
        vertex's reference of the last check to be worth a check now: a gate that costs one
        attempt's figures, so that a report checks every rule only when it may be the one that
        shows a slow host (most reports are not). The check then decides, with every attempt's
        figures as of now; a report the gate misses waits for the next Tick, as before. Before
        the vertex has a reference, an attempt's report that makes it judged opens the gate. A
        host that a report's check did not find slow is not checked at a report again until
        the next Tick: a task slow by its own data, outvoted on its host, would otherwise make
        every one of its reports walk the whole job.

        The figure is the one a judged running attempt is compared with running peers by, the
        larger of its average since deploying and its recent windows (`_running_evidence`)."""
        rule = job.rule.slow_host
        if live.host in job.slow_hosts or live.host in job.not_found_since_check:
            return False  # found, or checked at a report since the last check and not found
        kind, total = self._reading_kind(job, vertex, subtask, live)
        if kind != "judged":
            return False  # no rate yet, or none any more: the Tick judges it
        reference = vertex.running_cold_reference if live.cold else vertex.running_reference
        if reference is None or reference[1] - 1 < rule.min_peers:
            # No reference with enough peers at the last check (a vertex's first reports):
            # the attempt that has just become judged checks, which makes one; this happens
            # once per attempt, and only until the vertex has one.
            return live.reports == rule.min_reports
        figures = self._reading_figures(self._judged(live, total), reference[0], rule)
        ratio = slowdown(max(figures), reference[0])
        return ratio is not None and ratio >= rule.slowdown

    def _reading_kind(
        self, job: _JobState, vertex: _VertexState, subtask: int, live: _LiveAttempt
    ) -> tuple[_ReadingKind, int | None]:
        """What the slow-host rule can say of a reporting attempt, and its input size if known
        (reported, or assigned), for the check and the gate alike:
        - "none": no report, or its subtask has finished (a loser about to be cancelled);
        - "drained": all its input read, still running (the rest is processing, which reads
          nothing): its rate says nothing any more, but the lower bound of its whole figure is
          as good as a finished attempt's exact one; no peer is judged by it;
        - "young": fewer than `min-reports` reports with bytes (`_young_vote`);
        - "stopped": its size unknown and its reads stopped: processing what it read, or
          stalled, nothing tells which; its average is no rate (`_unsized_slowdown`);
        - "judged": sized, or still reading at its last report: its average is a rate."""
        p = live.progress
        if p is None or subtask in vertex.done:
            return "none", None
        total = p.bytes_total
        if total is None:
            total = self._assigned(job, vertex, subtask)
        if total is not None and p.bytes_read >= total:
            return "drained", total
        if live.reports < job.rule.slow_host.min_reports:
            return "young", total
        if total is None and not (live.history and live.history.reading_at(p.ts)):
            return "stopped", None
        return "judged", total

    @staticmethod
    def _judged(live: _LiveAttempt, total: int | None) -> _Judged:
        """A judged attempt with its average since deploying, to its last report."""
        p = live.progress
        assert p is not None
        return _Judged(live, (p.ts - live.deploying_ts) / p.bytes_read, total)

    def _check_on_evidence(self, trigger: AttemptProgress, job: _JobState) -> list[Record]:
        """A check at `trigger`'s time when the slow-host rule now finds a host it had not:
        the finding comes with the report that shows the host slow, up to a check interval
        before the next Tick would (issue 24's finding within 3 intervals). Still a pure
        function of the events: the report's time is the check's."""
        verdict = self._slow_hosts(trigger.ts, job)
        if not verdict[0] - job.slow_hosts:
            job.not_found_since_check.add(trigger.host)
            return []
        return self._check(trigger, job, verdict)

    def _check(
        self,
        trigger: _Trigger,
        job: _JobState,
        verdict: tuple[frozenset[str], dict[str, str]] | None = None,
    ) -> list[Record]:
        """Every rule, at `trigger`'s time: a Tick, or the report that gave a host not yet found
        slow enough evidence (`_check_on_evidence`), whose slow-host `verdict` is then already
        made."""
        out: list[SlowTasksDetected] = []
        slow_hosts: frozenset[str] = frozenset()
        where: dict[str, str] = {}
        if verdict is not None:
            slow_hosts, where = verdict
        elif job.rule.slow_host.enabled:
            slow_hosts, where = self._slow_hosts(trigger.ts, job)
        job.slow_hosts = slow_hosts
        job.not_found_since_check.clear()
        for name, vertex in job.vertices.items():
            finding = self._check_vertex(trigger, job, name, vertex, slow_hosts)
            if finding is not None:
                out.append(finding)
        if slow_hosts and not out:
            # A slow host with no live attempt left to copy (its evidence is finished attempts)
            # must still reach the blocklist: a finding with no slow subtask, on the vertex of
            # its latest evidence.
            name = where[min(slow_hosts)]
            out.append(self._finding(trigger, job, name, job.vertices[name], (), (0, None)))
        if slow_hosts:
            hosts = tuple(sorted(slow_hosts))
            out = [dataclasses.replace(f, slow_hosts=hosts) for f in out]
        self._findings += len(out)
        records: list[Record] = [*out]
        return records

    def _slow_hosts(self, now: int, job: _JobState) -> tuple[frozenset[str], dict[str, str]]:
        """The slow-host rule (`slow_host`): the hosts found slow now, and per host with
        evidence the vertex of its latest piece.

        A host's evidence is the slowdowns of its judged running attempts, and of its attempts
        that finished within the memory, but only those that finished after its oldest judged
        running attempt started: what the host did before its current work says nothing
        against it (a node that turns slow mid-job is judged by its slow attempts, not
        outvoted by its healthy past), while attempts it finished meanwhile on other slots
        speak for it (a task slow by its own data beside healthy neighbours)."""
        rule = job.rule.slow_host
        evidence: dict[str, list[float]] = {}
        where: dict[str, str] = {}
        oldest: dict[str, int] = {}
        # Per host, its running attempts that have read but are not judged yet (fewer than
        # `min-reports` reports) and read at their peers' pace so far: too young to condemn it,
        # but current work of the host that nothing shows slow, so each counts as a piece of
        # evidence for it (`_young_vote`). Otherwise the host's first attempt to reach
        # `min-reports` would be its only evidence until the others do: a task slow by its own
        # data, deployed beside healthy ones at the same time, would condemn its host for the
        # interval or two the others' reports lag.
        young: Counter[str] = Counter()
        for name, vertex in job.vertices.items():
            if not vertex.reporting:
                continue
            judged: list[_Judged] = []
            drained: list[tuple[_LiveAttempt, float]] = []
            unsized: list[_LiveAttempt] = []
            for (subtask, _), live in vertex.reporting.items():
                kind, total = self._reading_kind(job, vertex, subtask, live)
                if kind == "drained":
                    assert total is not None
                    drained.append((live, self._finished_figure(now, live, total)))
                elif kind == "young":
                    assert live.progress is not None
                    if self._young_vote(vertex, live, live.progress, rule):
                        young[live.host] += 1
                elif kind == "stopped":
                    unsized.append(live)
                elif kind == "judged":
                    judged.append(self._judged(live, total))
            self._attempts_examined += len(vertex.reporting)
            found = _Evidence(name, evidence, where, oldest)
            for live, per_byte in drained:
                finished = vertex.finished_cold_per_byte if live.cold else vertex.finished_per_byte
                median = finished.median()
                if len(finished) >= rule.min_peers and median is not None:
                    found.add(live, slowdown(per_byte, median))
            for live in unsized:
                ratio = self._unsized_slowdown(now, vertex, live, rule)
                if ratio is not None and ratio >= 1.0:
                    found.add(live, ratio)
            if not judged:
                continue
            # A warm attempt is judged against every peer (a cold one can only make it look
            # faster); a cold one only against cold ones, not against peers that paid no start.
            cold = [j for j in judged if j.live.cold]
            vertex.running_cold_reference = None
            if cold:
                vertex.running_cold_reference = self._running_evidence(
                    now, vertex, cold, True, rule, found
                )
            if len(cold) < len(judged):
                vertex.running_reference = self._running_evidence(
                    now, vertex, judged, False, rule, found
                )
            else:  # all cold (a vertex's first wave): the reference of all is theirs
                vertex.running_reference = vertex.running_cold_reference
        for host, seen in list(job.finished_evidence.items()):
            while seen and seen[0][0] < now - rule.memory_ms:
                seen.popleft()
            if not seen:
                del job.finished_evidence[host]
                continue
            since = oldest.get(host)
            for finished_ts, finished_ratio, vertex_name in seen:
                if since is None or finished_ts > since:
                    evidence.setdefault(host, []).append(finished_ratio)
                    where.setdefault(host, vertex_name)
            if since is None:
                where[host] = seen[-1][2]
        verdict = frozenset(
            h for h, items in evidence.items() if found_slow(items + [0.0] * young[h], rule)
        )
        return verdict, where

    @staticmethod
    def _young_vote(
        vertex: _VertexState, live: _LiveAttempt, p: Progress, rule: SlowHostRule
    ) -> bool:
        """Whether a young attempt (fewer than `min-reports` reports) speaks for its host: its
        average so far is under the slowdown against its vertex's reference of the last check
        (or the finished median of its kind), or there is no reference yet. One already that
        slow abstains: it is too young to count against its host, but it is no sign that the
        host keeps up either. (Counted for its host regardless, the young attempts of a host
        with many slots, in Spark's view where an attempt reports once per heartbeat, outvoted
        its judged slow ones for seconds: in a simulated 16-slot 5x host with 10 s heartbeats it
        was found at 22-26 s instead of 12-15 s.)"""
        running = vertex.running_cold_reference if live.cold else vertex.running_reference
        finished = vertex.finished_cold_per_byte if live.cold else vertex.finished_per_byte
        reference = running[0] if running is not None else None
        if reference is None and len(finished) >= rule.min_peers:
            reference = finished.median()
        if reference is None:
            return True
        ratio = slowdown((p.ts - live.deploying_ts) / p.bytes_read, reference)
        return ratio is None or ratio < rule.slowdown

    def _running_evidence(
        self,
        now: int,
        vertex: _VertexState,
        population: Sequence[_Judged],
        cold: bool,
        rule: SlowHostRule,
        found: _Evidence,
    ) -> tuple[float, int]:
        """The slowdowns of the `cold` (or warm) running attempts of `population`, each against
        the median of the population on other hosts, or of the vertex's finished attempts of the
        same kind when those are more numerous, into `found`; returns the population's median
        and size.

        Like is compared with like. Against running peers an attempt's average since deploying
        serves: theirs include a start as its does. A finished attempt's figure is its whole
        time over its whole input, its start spread over all of it, so against finished peers
        a young attempt's average (its start over a part of its input) would read slower than
        it will finish: it is judged by a lower bound of its own whole figure instead
        (`_finished_figure`). Its recent windows (reading only, no start) serve against
        both."""
        values = sorted(j.per_byte for j in population)
        middle = median_of_sorted(values)
        assert middle is not None
        # Per host, its attempts' averages (what the peers' median is made of), and what each
        # judged one says against the host when compared with running peers and with finished
        # ones.
        by_host: dict[str, tuple[list[float], list[_Judged], list[float], list[float]]] = {}
        for j in population:
            own, judged, recent, against = by_host.setdefault(j.live.host, ([], [], [], []))
            own.append(j.per_byte)
            if j.live.cold == cold:
                judged.append(j)
                own_figure, own_recent = self._reading_figures(j, middle, rule)
                recent.append(own_recent)
                against.append(max(own_figure, own_recent))
                found.judged(j.live)
        finished = vertex.finished_cold_per_byte if cold else vertex.finished_per_byte
        finished_count, finished_median = len(finished), finished.median()
        for own, judged, recent, against in by_host.values():
            if not judged:
                continue
            peers = len(values) - len(own)
            below = values[max(0, (len(values) - 1) // 2 - len(own))]
            reference: float | None
            if finished_median is not None and finished_count > peers:
                reference, peers = finished_median, finished_count
                typical = vertex.finished_input.median()
                against = [
                    max(self._finished_figure(now, j.live, j.total, typical), r)
                    for j, r in zip(judged, recent, strict=True)
                ]
            elif max(against) < rule.slowdown * below:
                # Without its own k values the median is at least the value k places below the
                # middle, so no attempt of the host can reach the slowdown: the median of all
                # serves (every ratio stays under the threshold, all the verdict reads), and the
                # exact one is computed only for hosts that may be slow.
                reference = middle
            else:
                own.sort()
                reference = median_without(values, own)
            if peers < rule.min_peers or reference is None:
                continue
            for j, per_byte in zip(judged, against, strict=True):
                if per_byte > 0:
                    found.add(j.live, slowdown(per_byte, reference))
        return middle, len(values)

    @staticmethod
    def _finished_figure(
        now: int, live: _LiveAttempt, total: int | None, typical: float | None = None
    ) -> float:
        """What a running attempt's time per byte will be at least when it finishes: its time so
        far over its whole input, or better, that plus the rest at the most favourable rate it
        has read at (`ReadHistory.projected_per_byte`).

        Its input size unknown (Spark's tasks): once it has read at least `typical` (the median
        input of its vertex's finished attempts), its time to its last report over what it had
        read; its start is then spread over as many bytes as a typical finished attempt spread
        its own over, and whatever it does after (more reads, processing) adds time as it did
        to theirs. As of the report, not now: a heartbeat is seconds, and it may have read more
        since. 0 before that."""
        p, history = live.progress, live.history
        if total is None:
            if p is None or typical is None or p.bytes_read <= 0 or p.bytes_read < typical:
                return 0.0
            return (p.ts - live.deploying_ts) / p.bytes_read
        bound = (now - live.deploying_ts) / max(total, 1)
        if p is None or history is None:
            return bound
        projected = history.projected_per_byte(p.ts, p.bytes_read, total)
        return bound if projected is None else max(bound, projected)

    @staticmethod
    def _unsized_slowdown(
        now: int, vertex: _VertexState, live: _LiveAttempt, rule: SlowHostRule
    ) -> float | None:
        """The slowdown of a running attempt whose input size is unknown (Spark says what a
        running task has read, never what it will read) and whose reads have stopped
        (`ReadHistory.reading_at` is false), against the finished attempts of its kind: None while
        fewer than `min-peers` have finished, or while nothing bounds it.

        Without a size, an attempt that has read all its input and is processing cannot be
        told from one that has stalled reading, so its average since deploying is no rate:
        it keeps growing once the reads end (a `mapInPandas` scan reads its split as one batch
        in its first second). Running peers' averages are then no reference either, and such
        an attempt is judged against finished peers only, by what its whole figure will be at
        least:
        - `_finished_figure`'s, for an unknown size: its average to its last report, once it
          has read a typical finished attempt's input;
        - its recent windows, ending where its reads last grew (reading only, never a stall
          that may be processing), each `window` times what the finished median takes to read
          its largest growth.
        Such a figure only ever bounds the attempt from below, so it is evidence against its
        host when it reaches the median peer (>= 1), and no evidence for it before."""
        finished = vertex.finished_cold_per_byte if live.cold else vertex.finished_per_byte
        median = finished.median()
        if len(finished) < rule.min_peers or not median or live.progress is None:
            return None
        figure = max(
            SlowTaskDetector._finished_figure(now, live, None, vertex.finished_input.median()),
            SlowTaskDetector._recent_per_byte(live, median, rule, to_last_growth=True),
        )
        return slowdown(figure, median) if figure > 0 else None

    @staticmethod
    def _reading_figures(j: _Judged, middle: float, rule: SlowHostRule) -> tuple[float, float]:
        """What a judged running attempt is held against running peers by: its average and its
        recent windows. Its size unknown (Spark's tasks), its reads grew at its last report but
        may have ended early in that interval and the rest be processing: both then end where
        its reads ended at the earliest (`ReadHistory.reading_end`), not at the report. Only
        its own figures: its peers' averages, which make the reference, can only be slower
        for it, which is in its favour."""
        if j.total is not None:
            return j.per_byte, SlowTaskDetector._recent_per_byte(j.live, middle, rule)
        history = j.live.history
        reading = history.reading_per_byte() if history is not None else None
        own = j.per_byte if reading is None else min(j.per_byte, reading)
        return own, SlowTaskDetector._recent_per_byte(j.live, middle, rule, to_last_growth=True)

    @staticmethod
    def _recent_per_byte(
        live: _LiveAttempt, middle: float, rule: SlowHostRule, to_last_growth: bool = False
    ) -> float:
        """The attempt's time per byte over its recent windows (`ReadHistory.recent_per_byte`),
        each at least `window` times what the vertex's median attempt takes to read the
        attempt's largest growth between two reports (about `window` report intervals, or
        batches, of reading at the peers' pace: as much evidence as `min-reports` gives the
        average). A node that turns slow after a long healthy stretch shows within a few of its
        reads, not once its slow part outweighs its healthy one. The windows end at its last
        report, or `to_last_growth` where its reads ended at the earliest
        (`ReadHistory.reading_end`: reading only, never a stop that may be processing). 0 when
        there is none."""
        history, p = live.history, live.progress
        if rule.window <= 0 or history is None or p is None or not history.points:
            return 0.0
        end_ts, end_read = history.points[-1] if to_last_growth else (p.ts, p.bytes_read)
        ended = history.reading_end() if to_last_growth else None
        if ended is not None:
            end_ts = ended  # where its reads ended at the earliest, not at the report
        span = rule.window * middle * history.largest
        recent = history.recent_per_byte(end_ts, end_read, span)
        return 0.0 if recent is None else recent

    def _check_vertex(
        self,
        trigger: _Trigger,
        job: _JobState,
        name: str,
        vertex: _VertexState,
        slow_hosts: frozenset[str] = frozenset(),
    ) -> SlowTasksDetected | None:
        n = vertex.parallelism
        if n is None:
            return None
        rule = job.rule
        flink = None
        if self._ratio_reached(vertex, n, rule.ratio):
            flink = self._baseline(vertex, rule.multiplier)
        tau = None
        if rule.progress.enabled:
            tau = self._progress_reference(vertex, rule.progress)
        on_slow_hosts: list[int] = []
        if slow_hosts:
            on_slow_hosts = [
                subtask
                for (subtask, _), live in vertex.live_by_age.items()
                if live.host in slow_hosts and subtask not in vertex.done
            ]
        # A vertex the slow-host rule reported slow gets its clearing finding (Flink's rule alone
        # never needs this: once its ratio is reached it stays reached).
        host_reported = vertex.reported_slow and rule.slow_host.enabled
        if flink is None and tau is None and not on_slow_hosts and not host_reported:
            return None
        candidates: dict[int, None] = dict.fromkeys(on_slow_hosts)
        if flink is not None:
            candidates.update(
                dict.fromkeys(self._old_enough(trigger.ts, rule.lower_bound_ms, vertex))
            )
        if tau is not None:
            candidates.update(dict.fromkeys(self._reporting(trigger.ts, vertex, rule.progress)))
        peers = None
        if tau is not None and rule.progress.host_corroboration > 0:
            # Walked on the first attempt the progress rule finds slow, once per tick: most
            # ticks find none, and need no third walk of the live attempts.
            peers = functools.cache(
                functools.partial(self._slowdowns_by_host, trigger.ts, vertex, rule.progress, tau)
            )
        slow: list[SlowSubtask] = []
        for subtask in candidates:
            attempts = vertex.live[subtask]
            entries = self._judge(
                trigger.ts, job, vertex, subtask, attempts, flink, tau, peers, slow_hosts
            )
            if entries is not None:
                slow.append(SlowSubtask(subtask, entries, vertex.latest_attempt[subtask]))
        if not slow and not vertex.reported_slow:
            return None
        vertex.reported_slow = bool(slow)
        slow.sort(key=lambda s: s.subtask)
        # Flink's baseline once R has finished; before that, the progress rule's reference.
        return self._finding(
            trigger, job, name, vertex, tuple(slow), flink if flink is not None else (0, tau)
        )

    def _finding(
        self,
        trigger: _Trigger,
        job: _JobState,
        name: str,
        vertex: _VertexState,
        slow: tuple[SlowSubtask, ...],
        baseline: tuple[int, float | None],
    ) -> SlowTasksDetected:
        baseline_ms, per_byte = baseline
        ns_per_byte = None
        if per_byte is not None and math.isfinite(per_byte):
            ns_per_byte = per_byte * _NS_PER_MS
        return SlowTasksDetected(
            job_id=trigger.job_id,
            ts=trigger.ts,
            id=derived_id(self.SERVICE, trigger.id, name),
            caused_by=(trigger.id,),
            vertex=name,
            speculation_safe=vertex.spec.speculation_safe,
            baseline_ms=baseline_ms,
            baseline_ns_per_byte=ns_per_byte,
            slow=slow,
            hosts=job.host_list(),
        )

    def _progress_reference(self, vertex: _VertexState, rule: ProgressRule) -> float | None:
        """τ of the progress-rate rule (`progress.reference_per_byte`)."""
        running: list[float] = []
        for (subtask, _), live in vertex.live_by_age.items():
            p = live.progress
            if p is None or p.bytes_read <= 0 or subtask in vertex.done:
                continue
            elapsed = p.ts - live.deploying_ts
            if elapsed >= rule.min_elapsed_ms:
                running.append(elapsed / p.bytes_read)
        self._attempts_examined += len(vertex.live_by_age)
        return reference_per_byte(running, vertex.finished_per_byte)

    @staticmethod
    def _slowdowns_by_host(
        now: int, vertex: _VertexState, rule: ProgressRule, tau: float
    ) -> dict[str, list[tuple[int, int, float]]]:
        """Per host, (subtask, attempt, time per byte / τ) of the vertex's running attempts
        that have reported and run for the minimum: what corroborates a slow host."""
        peers: dict[str, list[tuple[int, int, float]]] = {}
        if tau <= 0:
            return peers
        for (subtask, attempt), live in vertex.live_by_age.items():
            if now - live.deploying_ts < rule.min_elapsed_ms:
                break  # deploying order: the rest are younger
            p = live.progress
            if p is None or p.bytes_read <= 0 or subtask in vertex.done:
                continue
            per_byte = (p.ts - live.deploying_ts) / p.bytes_read
            peers.setdefault(live.host, []).append((subtask, attempt, per_byte / tau))
        return peers

    @staticmethod
    def _reporting(now: int, vertex: _VertexState, rule: ProgressRule) -> list[int]:
        """Unfinished subtasks with a live attempt that has reported progress and has run for
        the progress rule's minimum."""
        subtasks: dict[int, None] = {}
        for (subtask, _), live in vertex.live_by_age.items():
            if now - live.deploying_ts < rule.min_elapsed_ms:
                break  # deploying order: the rest are younger
            if live.progress is not None and subtask not in vertex.done:
                subtasks[subtask] = None
        return list(subtasks)

    @staticmethod
    def _ratio_reached(vertex: _VertexState, n: int, ratio: float) -> bool:
        """`getJobVerticesToCheck`: finished subtasks / N ≥ R, as a double. (Flink also skips a
        vertex whose subtasks have all finished; such a vertex has no attempt to judge, and
        checking it lets a last empty finding clear it for the readers of findings.)"""
        return len(vertex.finished) / n >= ratio

    @staticmethod
    def _baseline(vertex: _VertexState, multiplier: float) -> tuple[int, float | None] | None:
        """`getBaseline`: the element at index K/2 of the K fastest finished attempts (by time
        per byte when sizes are known, else by time); its time × M rounded down as Java's
        (long) cast does; per byte over that element's own bytes. K = 0: a 0 baseline.
        None: not enough finished attempts seen (e.g. their deploying was never seen)."""
        if vertex.k == 0:
            return 0, None
        assert vertex.plain is not None and vertex.per_byte is not None
        plain = vertex.plain.element()
        if plain is None:
            return None
        baseline_ms = int(plain[0] * multiplier)
        per_byte = vertex.per_byte.element()
        if per_byte is None:
            return baseline_ms, None
        time_ms, size = per_byte
        assert size is not None
        return baseline_ms, time_per_byte(int(time_ms * multiplier), size)

    def _old_enough(self, now: int, lower_bound_ms: int, vertex: _VertexState) -> list[int]:
        """Unfinished subtasks with a live attempt that has run for at least the lower bound."""
        subtasks: dict[int, None] = {}
        examined = 0
        for (subtask, _), live in vertex.live_by_age.items():
            examined += 1
            if now - live.deploying_ts < lower_bound_ms:
                break
            if subtask not in vertex.done:
                subtasks[subtask] = None
        self._attempts_examined += examined
        return list(subtasks)

    def _judge(
        self,
        now: int,
        job: _JobState,
        vertex: _VertexState,
        subtask: int,
        attempts: dict[int, _LiveAttempt],
        flink: tuple[int, float | None] | None,
        tau: float | None,
        peers: Callable[[], dict[str, list[tuple[int, int, float]]]] | None = None,
        slow_hosts: frozenset[str] = frozenset(),
    ) -> tuple[SlowAttempt, ...] | None:
        """All live attempts of `subtask` if at least one of them is slow by a rule in force,
        else None. `peers`: gives the running attempts' slowdowns by host, when the progress
        rule needs its host corroborated (`_slowdowns_by_host`). An attempt on a host the
        slow-host rule found slow is slow, whatever its own age or reports: it gets its copy
        at once."""
        lower_bound = job.rule.lower_bound_ms
        progress_rule = job.rule.progress
        size = self._assigned(job, vertex, subtask)
        entries: list[SlowAttempt] = []
        any_slow = False
        for live in attempts.values():
            execution_ms = now - live.deploying_ts
            # Without a size (Spark), what it has read so far: its size is at least that.
            read = live.progress.bytes_read if live.progress is not None else 0
            known = size if size is not None else (read or None)
            slow = False
            total = None
            if tau is not None and live.progress is not None:
                total = live.progress.bytes_total if live.progress.bytes_total is not None else size
            if total:
                # The attempt reports its progress and its total is known: the progress-rate
                # rule judges it, more precisely than elapsed time can.
                assert tau is not None and live.progress is not None
                if execution_ms >= progress_rule.min_elapsed_ms:
                    left = time_left_ms(now, live.deploying_ts, live.progress, total)
                    slow = is_slow(left, total, tau, progress_rule)
                    if slow and peers is not None:
                        evidence = [
                            ratio
                            for other_subtask, other_attempt, ratio in peers().get(live.host, ())
                            if (other_subtask, other_attempt) != (subtask, live.attempt)
                        ]
                        last = job.last_finished_slowdown.get(live.host)
                        if last is not None:
                            evidence.append(last)
                        slow = corroborated(evidence, progress_rule)
            elif flink is not None and execution_ms >= lower_bound:
                baseline_ms, baseline_per_byte = flink
                if size is not None and baseline_per_byte is not None:
                    slow = time_per_byte(execution_ms, size) >= baseline_per_byte
                else:
                    # Unknown sizes, or a 0 baseline (ratio 0): plain times, as Flink does.
                    slow = execution_ms >= baseline_ms
                    if slow and known is not None and baseline_per_byte is not None:
                        # ...but a running Spark task says what it has read so far: one that
                        # has read more than the median attempt at the usual time per byte is
                        # long by its data, not slow.
                        slow = time_per_byte(execution_ms, known) >= baseline_per_byte
            slow = slow or live.host in slow_hosts
            any_slow = any_slow or slow
            # The blocklist weighs it per byte (read, without a size), not in plain time that
            # counts a task's data against its host.
            entries.append(
                SlowAttempt(live.attempt, live.host, execution_ms, known, live.speculative, slow)
            )
        if not any_slow:
            return None
        entries.sort(key=lambda a: a.attempt)
        return tuple(entries)

    # ------------------------------------------------------------------ end of a job

    def _job_finished(self, event: JobFinished, job: _JobState) -> list[Record]:
        """Clear every vertex still reported slow, so readers of findings alone (speculator
        metrics, blocklist) do not keep a finished job's vertices slow forever."""
        out: list[Record] = []
        for name, vertex in job.vertices.items():
            if not vertex.reported_slow:
                continue
            out.append(
                SlowTasksDetected(
                    job_id=event.job_id,
                    ts=event.ts,
                    id=derived_id(self.SERVICE, event.id, name),
                    caused_by=(event.id,),
                    vertex=name,
                    speculation_safe=vertex.spec.speculation_safe,
                    baseline_ms=0,
                    baseline_ns_per_byte=None,
                    slow=(),
                    hosts=job.host_list(),
                )
            )
        del self._jobs[event.job_id]
        self._findings += len(out)
        return out
