"""Speculative execution (FLIP-168, flink-10644), as a pure core: findings in, commands out.

For each slow subtask of a speculation-safe vertex, launch enough mirror attempts to bring its
live attempts up to `execution.batch.speculative.max-concurrent-executions`, away from the hosts
its live attempts run on. A subtask's state is identified by its latest attempt number: the
detector repeats a finding every Tick while the subtask stays slow, and a repeat of a state
already answered must not launch again (the command id is derived from that state too, so a
restarted speculator re-emits the same id and the agent applies it once).

A job's own settings (`execution.batch.speculative.*` in its config) apply to that job alone:
the speculator reads no events, so it learns them from the detector's `FindingSettings`, the
first finding of every job (`model.policy_settings`); as everywhere, a key the service's own
configuration sets wins (`Settings.for_job`).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import ClassVar

from tailguard.model.config import Settings
from tailguard.model.ids import derived_id
from tailguard.model.records import (
    FindingSettings,
    LaunchSpeculativeAttempts,
    Record,
    SlowTasksDetected,
    SpeculativeAttemptWon,
)

__all__ = ["SpeculationStrategy"]

# Findings carry no end-of-job marker the speculator could rely on, so the state of the least
# recently active jobs is dropped beyond this many, which bounds memory across many jobs.
MAX_TRACKED_JOBS = 1024


@dataclass(frozen=True, slots=True)
class _Rule:
    enabled: bool
    max_concurrent: int

    @classmethod
    def from_settings(cls, settings: Settings) -> _Rule:
        return cls(
            settings.flag("execution.batch.speculative.enabled"),
            settings.integer("execution.batch.speculative.max-concurrent-executions"),
        )


class _JobState:
    __slots__ = ("answered", "effective", "rule", "slow_vertices")

    def __init__(self, rule: _Rule) -> None:
        # (vertex, subtask, latest attempt) already answered.
        self.answered: set[tuple[str, int, int]] = set()
        self.slow_vertices: set[str] = set()
        self.effective = 0
        self.rule = rule


class SpeculationStrategy:
    SERVICE: ClassVar[str] = "speculator"

    def __init__(self, settings: Settings, max_tracked_jobs: int = MAX_TRACKED_JOBS) -> None:
        self.settings = settings
        self._rule = _Rule.from_settings(settings)
        self._max_jobs = max_tracked_jobs
        self._jobs: OrderedDict[str, _JobState] = OrderedDict()
        self._launched_attempts = 0
        self._effective_total = 0

    def handle(self, record: Record) -> list[Record]:
        if isinstance(record, SlowTasksDetected):
            return self._slow(record, self._job(record.job_id))
        if isinstance(record, SpeculativeAttemptWon):
            self._job(record.job_id).effective += 1
            self._effective_total += 1
        elif isinstance(record, FindingSettings) and record.job_settings:
            self._job(record.job_id).rule = _Rule.from_settings(
                self.settings.for_job(record.job_settings)
            )
        return []

    def metrics(self) -> dict[str, float]:
        return {
            "numSlowExecutionVertices": float(
                sum(len(job.slow_vertices) for job in self._jobs.values())
            ),
            "numEffectiveSpeculativeExecutions": float(self._effective_total),
            "speculativeAttemptsLaunched": float(self._launched_attempts),
            "jobs": float(len(self._jobs)),
        }

    def _job(self, job_id: str) -> _JobState:
        job = self._jobs.get(job_id)
        if job is None:
            job = self._jobs[job_id] = _JobState(self._rule)
            while len(self._jobs) > self._max_jobs:
                self._jobs.popitem(last=False)
        else:
            self._jobs.move_to_end(job_id)
        return job

    def _slow(self, finding: SlowTasksDetected, job: _JobState) -> list[Record]:
        if finding.slow:
            job.slow_vertices.add(finding.vertex)
        else:
            job.slow_vertices.discard(finding.vertex)
        if not (job.rule.enabled and finding.speculation_safe):
            return []
        out: list[Record] = []
        for subtask in finding.slow:
            key = (finding.vertex, subtask.subtask, subtask.latest_attempt)
            if key in job.answered:
                continue
            job.answered.add(key)
            count = job.rule.max_concurrent - len(subtask.live_attempts)
            if count <= 0:
                continue
            self._launched_attempts += count
            out.append(
                LaunchSpeculativeAttempts(
                    job_id=finding.job_id,
                    ts=finding.ts,
                    id=derived_id(
                        self.SERVICE,
                        finding.job_id,
                        finding.vertex,
                        subtask.subtask,
                        subtask.latest_attempt,
                    ),
                    caused_by=(finding.id,),
                    vertex=finding.vertex,
                    subtask=subtask.subtask,
                    count=count,
                    avoid_hosts=tuple(sorted({a.host for a in subtask.live_attempts})),
                )
            )
        return out
