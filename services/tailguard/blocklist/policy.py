"""Slow-node blocking on evidence (FLIP-168 / FLIP-224), as a pure core: findings in, commands out.

FLIP-168 blocks the host of every slow attempt. One slow attempt says little about its host: the
noise in task times makes a few attempts on healthy hosts slow by any rule (measured: 113
healthy hosts of 1,000 blocked in `make bench-sim`, seed 1). So a host is blocked only on
evidence that points at the host rather than at the task:

- **Evidence** is a distinct slow subtask on the host, seen within the last
  `blocklist.evidence-window` (a slow attempt keeps its evidence fresh while the detector keeps
  reporting it; its subtask counts once however many Ticks repeat it).
- **A task, not a host:** a subtask with slow attempts on two or more hosts at once is slow
  wherever it runs (skew the byte normalisation could not see, a bad record), so it is no
  evidence against either host.
- **Beyond the noise:** a slow attempt is evidence only at `blocklist.evidence-slowdown` times
  its vertex's median (per byte when known): FLIP-168 calls 1.5x slow, and ±30% noise alone
  spreads attempts up to 1.86x apart.
- **Block** once a host has `blocklist.min-slow-attempts` pieces of evidence, until the
  finding's time plus `execution.batch.speculative.block-slow-node-duration`; new evidence
  extends the block, re-emitted only once the extension reaches half the duration (the detector
  repeats its findings every Tick).
- **Unblock early** a blocked host whose evidence has all gone stale (none within the window)
  and none of whose attempts is slow now: its slow attempts finished or recovered. The block
  would otherwise hold the host's slots for the rest of the duration.

- **A host found slow** by the detector's slow-host rule (`SlowTasksDetected.slow_hosts`: its
  attempts read several times slower per input byte than their peers, over several progress
  reports) is blocked at once: that verdict already weighs the host's attempts against their
  peers', so it needs no second slow subtask. It counts as one piece of evidence (keyed by the
  vertex and subtask `HOST_FINDING`), kept fresh while the detector repeats the verdict.

`blocklist.min-slow-attempts = 1`, `blocklist.evidence-window = 0 ms` and
`blocklist.evidence-slowdown = 0` are FLIP-168's rule
(every slow attempt's host, no early unblock); with the detector's slow-host rule off no
finding names a slow host.

At most `max_blocked_hosts(registered, blocklist.max-blocked-fraction)` hosts are blocked at once,
and never all of them, so a job can always make progress. `blocked_fraction_problem` states that
rule once (in model.blocking) for the core and the actuators' validation of `BlockNodes`. When more
hosts qualify, those with the most evidence go first, then by name; the rest are skipped.

Blocks are tracked against the time of the findings (the agent lifts a block when its time is
up), so this core never needs the wall clock.

A job's own blocklist settings (the four keys of `BlockRule` in its config) make the rule for
that job's own blocks: the core learns them from the detector's `FindingSettings`, the first
finding of every job (`model.policy_settings`); a key the service's configuration sets wins
(`Settings.for_job`). The fleet's blocks across jobs keep the service's rule.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection
from dataclasses import astuple, dataclass, field
from typing import Any, ClassVar

from tailguard.model.blocking import blocked_fraction_problem, max_blocked_hosts
from tailguard.model.config import Settings
from tailguard.model.ids import derived_id
from tailguard.model.records import (
    BlockNodes,
    FindingSettings,
    Record,
    SlowAttempt,
    SlowTasksDetected,
    UnblockNodes,
)

__all__ = [
    "HOST_FINDING",
    "LATE_FINDINGS_MS",
    "BlockRule",
    "BlocklistTracker",
    "Forgetting",
    "forget_after_ms",
    "found_slow",
    "host_evidence",
]

# Findings carry no end-of-job marker, so beyond this many jobs with state the least recently
# active job's state is dropped (its blocks expire at the agent anyway).
MAX_TRACKED_JOBS = 1024


# How far behind a finding already read another may come and still find what it would have: the
# time that forgets is the finding being read, and the drivers' clocks differ, and a service that
# catches up reads one partition's backlog ahead of another's.
LATE_FINDINGS_MS = 10 * 60_000


def forget_after_ms(rule: BlockRule) -> int:
    """How long after its last finding a job's state, and a piece of fleet evidence, is
    forgotten: twice the longest horizon any of it is read with, plus `LATE_FINDINGS_MS`. A
    block lasts D, per-job evidence counts for W, the fleet's for max(W, D), a job stays
    "active" for D, and what it was sent matters D/2 beyond its block: past 2 max(W, D) a silent
    job's state is a new job's, and no decision reads evidence that old."""
    return 2 * max(rule.window_ms, rule.duration_ms) + LATE_FINDINGS_MS


# The subtask a host finding (`SlowTasksDetected.slow_hosts`) is kept under as evidence: no
# real subtask has it, so it counts once per vertex beside the host's slow subtasks.
HOST_FINDING = -1


def found_slow(finding: SlowTasksDetected, registered: Collection[str]) -> set[str]:
    """The registered hosts the finding names slow by the detector's slow-host rule: blocked
    without waiting for `blocklist.min-slow-attempts` (the per-job tracker and the fleet)."""
    return {host for host in finding.slow_hosts if host in registered}


def slowdown(attempt: SlowAttempt, finding: SlowTasksDetected, multiplier: float) -> float | None:
    """How many times the vertex's median an attempt took, per input byte when both sizes are
    known, else in time: the finding's baseline is that median × the detector's multiplier
    (FLIP-168's `getBaseline`). None: no baseline to compare with."""
    if multiplier <= 0:
        return None
    if finding.baseline_ns_per_byte and attempt.input_bytes:
        per_byte = attempt.execution_time_ms * 1_000_000 / attempt.input_bytes
        return per_byte * multiplier / finding.baseline_ns_per_byte
    if finding.baseline_ms > 0:
        return attempt.execution_time_ms * multiplier / finding.baseline_ms
    return None


def _against_host(attempt: SlowAttempt, finding: SlowTasksDetected, rule: BlockRule) -> bool:
    # FLIP-168 calls an attempt slow at 1.5x the median, and ±30% noise alone spreads attempts
    # up to 1.3 / 0.7 = 1.86x apart: a host that is merely on the slow side of the noise would
    # collect evidence. Only an attempt beyond the noise counts against its host.
    if rule.evidence_slowdown <= 0:
        return True
    seen = slowdown(attempt, finding, rule.multiplier)
    return seen is None or seen >= rule.evidence_slowdown


def host_evidence(
    finding: SlowTasksDetected, registered: Collection[str], rule: BlockRule
) -> tuple[list[tuple[int, str]], int]:
    """The evidence a finding gives against hosts, as (subtask, host), and how many slow
    attempts it blames on their task instead: a subtask slow on two or more registered hosts at
    once is slow wherever it runs (with `blocklist.evidence-window = 0 ms`, FLIP-168's rule,
    every slow attempt's host counts), and an attempt under `blocklist.evidence-slowdown` times
    the vertex's median is within the noise (0: every slow attempt counts, as FLIP-168). The one
    statement of the rule, for the per-job tracker and the fleet."""
    window_ms = rule.window_ms
    evidence: list[tuple[int, str]] = []
    blamed_on_task = 0
    for subtask in finding.slow:
        hosts = {
            a.host
            for a in subtask.live_attempts
            if a.slow and a.host in registered and _against_host(a, finding, rule)
        }
        if len(hosts) > 1 and window_ms > 0:
            blamed_on_task += len(hosts)
            continue
        evidence.extend((subtask.subtask, host) for host in sorted(hosts))
    evidence.extend((HOST_FINDING, host) for host in sorted(found_slow(finding, registered)))
    return evidence, blamed_on_task


@dataclass(frozen=True, slots=True)
class BlockRule:
    """The blocklist settings, read once (the per-job tracker, the fleet, the fleet's replay
    check)."""

    duration_ms: int
    fraction: float
    min_evidence: int
    window_ms: int
    # A slow attempt is evidence against its host at this many times the vertex's median
    # (0: always); the detector's baseline multiplier reads the median back from a finding.
    evidence_slowdown: float = 0.0
    multiplier: float = 1.5

    @classmethod
    def from_settings(cls, settings: Settings) -> BlockRule:
        return cls(
            duration_ms=settings.duration_ms(
                "execution.batch.speculative.block-slow-node-duration"
            ),
            fraction=settings.number("blocklist.max-blocked-fraction"),
            min_evidence=max(1, settings.integer("blocklist.min-slow-attempts")),
            window_ms=settings.duration_ms("blocklist.evidence-window"),
            evidence_slowdown=settings.number("blocklist.evidence-slowdown"),
            multiplier=settings.number("slow-task-detector.execution-time.baseline-multiplier"),
        )


@dataclass
class Forgetting:
    """When state is swept on finding time: at most once per half of `after_ms`
    (`forget_after_ms`), so the work per finding stays constant. One schedule for the per-job
    tracker and the fleet; `next_sweep` is part of their states."""

    after_ms: int
    next_sweep: int | None = None  # finding ts at which the next sweep is due

    @classmethod
    def of(cls, rule: BlockRule, after_ms: int | None = None) -> Forgetting:
        """`after_ms` overrides `forget_after_ms(rule)`: the tests' "never" shows forgetting
        changes no decision."""
        return cls(forget_after_ms(rule) if after_ms is None else after_ms)

    def horizon(self, now: int) -> int | None:
        """When a sweep is due at `now`: the time before which state is forgotten; else None."""
        if self.next_sweep is not None and now < self.next_sweep:
            return None
        self.next_sweep = now + self.after_ms // 2
        return now - self.after_ms


@dataclass
class _Job:
    # host -> until ts of the last BlockNodes emitted for it (what the agent holds).
    blocked: dict[str, int] = field(default_factory=dict)
    # host -> (vertex, subtask) -> ts it was last seen slow there.
    evidence: dict[str, dict[tuple[str, int], int]] = field(default_factory=dict)
    # ts of the job's last finding: when to forget it (`forget_after_ms`).
    last_ts: int = 0

    def fresh_evidence(self, host: str, now: int, window_ms: int) -> int:
        """Drop the evidence older than the window; what is left."""
        seen = self.evidence.get(host)
        if not seen:
            return 0
        for key in [k for k, ts in seen.items() if ts < now - window_ms]:
            del seen[key]
        if not seen:
            del self.evidence[host]
            return 0
        return len(seen)


@dataclass
class _Counts:
    """What `metrics()` counts (in the state: a restored service goes on counting)."""

    blocks_issued: int = 0
    hosts_blocked: int = 0
    skipped: int = 0
    unblocks_issued: int = 0
    early_unblocks: int = 0
    # Slow attempts not counted against their host: their subtask was slow on 2+ hosts.
    task_evidence: int = 0


class BlocklistTracker:
    SERVICE: ClassVar[str] = "blocklist"

    def __init__(
        self,
        settings: Settings,
        max_tracked_jobs: int = MAX_TRACKED_JOBS,
        forget_after: int | None = None,
    ) -> None:
        """`forget_after` (ms) overrides `forget_after_ms` (`Forgetting.of`)."""
        self.settings = settings
        self._rule = BlockRule.from_settings(settings)
        self._max_jobs = max_tracked_jobs
        self._jobs: OrderedDict[str, _Job] = OrderedDict()
        # The rules of jobs whose own settings differ from the service's, most recent last.
        self._job_rules: OrderedDict[str, BlockRule] = OrderedDict()
        self._forgetting = Forgetting.of(self._rule, forget_after)
        self._counts = _Counts()

    def handle(self, record: Record) -> list[Record]:
        if isinstance(record, FindingSettings):
            self._learn_rule(record)
        if not isinstance(record, SlowTasksDetected):
            return []
        self._forget_silent_jobs(record.ts)
        job = self._jobs.pop(record.job_id, None) or _Job()
        job.last_ts = record.ts
        out = self._update(record, job)
        if job.blocked or job.evidence:
            self._jobs[record.job_id] = job
            while len(self._jobs) > self._max_jobs:
                self._jobs.popitem(last=False)
        return out

    def metrics(self) -> dict[str, float]:
        return {
            "blockedHosts": float(sum(len(job.blocked) for job in self._jobs.values())),
            "blocksIssued": float(self._counts.blocks_issued),
            "hostsBlocked": float(self._counts.hosts_blocked),
            "hostsSkippedByFraction": float(self._counts.skipped),
            "unblocksIssued": float(self._counts.unblocks_issued),
            "earlyUnblocks": float(self._counts.early_unblocks),
            # Slow attempts not counted against their host: their subtask was slow on 2+ hosts.
            "slowAttemptsBlamedOnTheTask": float(self._counts.task_evidence),
        }

    def _learn_rule(self, announced: FindingSettings) -> None:
        if not announced.job_settings:
            return
        rule = BlockRule.from_settings(self.settings.for_job(announced.job_settings))
        self._job_rules.pop(announced.job_id, None)
        if rule != self._rule:
            self._job_rules[announced.job_id] = rule
            while len(self._job_rules) > self._max_jobs:
                self._job_rules.popitem(last=False)

    def rule_of(self, job_id: str) -> BlockRule:
        """The rule of `job_id`'s own blocks: its settings over the service's."""
        return self._job_rules.get(job_id, self._rule)

    def _forget_silent_jobs(self, now: int) -> None:
        """Drop the state of jobs silent for `forget_after_ms`: every block it holds has expired
        and all its evidence is stale, so its next finding would find it as a new job's. A job
        that ended sends no more findings and no marker, so without this its last evidence
        stayed until 1,024 later jobs pushed it out (`Forgetting`: swept at most once per half
        that time)."""
        horizon = self._forgetting.horizon(now)
        if horizon is None:
            return
        for job_id in [j for j, job in self._jobs.items() if job.last_ts < horizon]:
            del self._jobs[job_id]

    @property
    def jobs_held(self) -> int:
        return len(self._jobs)

    def state(self) -> dict[str, Any]:
        """Everything a later decision depends on, as JSON values (`load_state` reads it): the
        blocklist service snapshots its core's state, not its input (`tailguard.system.retention`
        says why)."""
        return {
            "jobs": [
                [
                    job_id,
                    job.last_ts,
                    sorted(job.blocked.items()),
                    [
                        [h, [[v, s, ts] for (v, s), ts in seen.items()]]
                        for h, seen in job.evidence.items()
                    ],
                ]
                for job_id, job in self._jobs.items()
            ],
            "next_sweep": self._forgetting.next_sweep,
            "counts": list(astuple(self._counts)),
            "rules": [[job_id, list(astuple(rule))] for job_id, rule in self._job_rules.items()],
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Take over a state `state()` gave (this tracker's own is replaced)."""
        self._jobs = OrderedDict(
            (
                str(job_id),
                _Job(
                    blocked={str(h): int(until) for h, until in blocked},
                    evidence={
                        str(h): {(str(v), int(s)): int(ts) for v, s, ts in seen}
                        for h, seen in evidence
                    },
                    last_ts=int(last_ts),
                ),
            )
            for job_id, last_ts, blocked, evidence in state["jobs"]
        )
        sweep = state["next_sweep"]
        self._forgetting.next_sweep = None if sweep is None else int(sweep)
        self._counts = _Counts(*(int(n) for n in state["counts"]))
        # Absent from states written before jobs had rules of their own.
        self._job_rules = OrderedDict(
            (str(job_id), _rule_from_state(rule, self._rule))
            for job_id, rule in state.get("rules", [])
        )

    def limit(self, registered_hosts: int, rule: BlockRule | None = None) -> int:
        """How many hosts may be blocked at once in a cluster of this size."""
        return max_blocked_hosts(registered_hosts, (rule or self._rule).fraction)

    # ------------------------------------------------------------------ the decision

    def _update(self, finding: SlowTasksDetected, job: _Job) -> list[Record]:
        rule = self.rule_of(finding.job_id)
        now = finding.ts
        registered = set(finding.hosts)
        blocked = job.blocked
        # A block whose time is up is lifted by the agent. A block on a host that left the
        # cluster stays (the agent still holds it should the host come back) but takes no slot
        # of the fraction while the host is away.
        for host in [h for h, until in blocked.items() if until <= now]:
            del blocked[host]
        out: list[Record] = []
        excess = sum(1 for h in blocked if h in registered) - self.limit(len(registered), rule)
        if excess > 0:  # the cluster shrank, or blocked hosts came back
            out.append(self._unblock(finding, blocked, registered, excess))
        slow_now = self._record_evidence(finding, job, registered, rule)
        found = found_slow(finding, registered)
        if rule.window_ms > 0:
            recovered = [
                h
                for h in sorted(blocked)
                if h not in slow_now and job.fresh_evidence(h, now, rule.window_ms) == 0
            ]
            if recovered:
                out.append(self._unblock_hosts(finding, blocked, recovered))
                self._counts.early_unblocks += len(recovered)
        until = now + rule.duration_ms
        to_emit: list[str] = []
        candidates = []
        for host in sorted(job.evidence):
            count = job.fresh_evidence(host, now, rule.window_ms)
            enough = count >= rule.min_evidence or host in found
            if host in registered and enough and host in slow_now:
                candidates.append((-count, host))
        for _, host in sorted(candidates):
            current = blocked.get(host)
            if current is None:
                if blocked_fraction_problem(blocked, (host,), registered, rule.fraction):
                    self._counts.skipped += 1
                    continue
                blocked[host] = until
                to_emit.append(host)
                self._counts.hosts_blocked += 1
            elif until - current >= rule.duration_ms / 2:
                blocked[host] = until
                to_emit.append(host)
        if to_emit:
            hosts = tuple(sorted(to_emit))
            self._counts.blocks_issued += 1
            out.append(
                BlockNodes(
                    job_id=finding.job_id,
                    ts=now,
                    id=derived_id(self.SERVICE, finding.id, *hosts),
                    caused_by=(finding.id,),
                    hosts=hosts,
                    until_ts=until,
                    cause=f"slow attempts of vertex {finding.vertex}",
                )
            )
        return out

    def _record_evidence(
        self, finding: SlowTasksDetected, job: _Job, registered: set[str], rule: BlockRule
    ) -> set[str]:
        """Note each host's slow subtasks; returns the hosts with a slow attempt now."""
        evidence, blamed_on_task = host_evidence(finding, registered, rule)
        self._counts.task_evidence += blamed_on_task
        for subtask, host in evidence:
            job.evidence.setdefault(host, {})[(finding.vertex, subtask)] = finding.ts
        return {host for _, host in evidence}

    def _unblock(
        self,
        finding: SlowTasksDetected,
        blocked: dict[str, int],
        registered: set[str],
        excess: int,
    ) -> UnblockNodes:
        """Lift the blocks that would end soonest (then by name) to get back under the limit."""
        candidates = [h for h in blocked if h in registered]
        lifted = sorted(candidates, key=lambda h: (blocked[h], h))[:excess]
        return self._unblock_hosts(finding, blocked, lifted)

    def _unblock_hosts(
        self, finding: SlowTasksDetected, blocked: dict[str, int], lifted: list[str]
    ) -> UnblockNodes:
        for host in lifted:
            del blocked[host]
        hosts = tuple(sorted(lifted))
        self._counts.unblocks_issued += 1
        return UnblockNodes(
            job_id=finding.job_id,
            ts=finding.ts,
            id=derived_id(self.SERVICE, finding.id, "unblock", *hosts),
            caused_by=(finding.id,),
            hosts=hosts,
        )


def _rule_from_state(values: list[Any], service: BlockRule) -> BlockRule:
    """A job's rule as `state()` wrote it; a state from before the evidence slowdown (four
    values) takes the service's."""
    d, f, m, w = values[:4]
    slowdown_, multiplier = (
        values[4:6]
        if len(values) >= 6
        else (
            service.evidence_slowdown,
            service.multiplier,
        )
    )
    return BlockRule(int(d), float(f), int(m), int(w), float(slowdown_), float(multiplier))
