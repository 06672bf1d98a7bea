"""What `tailguard.run` returns."""

from __future__ import annotations

from dataclasses import dataclass, field

from tailguard.model.percentile import percentile


@dataclass(frozen=True)
class AttemptSummary:
    vertex: str
    subtask: int
    attempt: int
    host: str
    speculative: bool
    status: str  # FINISHED, FAILED, CANCELED
    won: bool
    duration_ms: int
    cancel_reason: str | None = None
    error: str | None = None
    # Bytes its operators spilled to local files (group assembly, a join's build side).
    spilled_bytes: int = 0


@dataclass(frozen=True)
class RecoverySummary:
    """What a recovered run (`recover=`) took over and what it had to run again."""

    source: str  # where the dead driver's log was read from
    events_before: int  # events of the log it took over
    kept_results: int  # finished results (partitions, committed sink parts) that verified
    lost_attempts: int  # attempts running when the driver died
    lost_results: int  # finished results whose files no longer verified
    rerun_results: int  # of those, the ones a consumer still needed (produced again)
    attempts_after: int  # attempts this run deployed (re-runs, and what was never started)

    def line(self) -> str:
        return (
            f"recovered from {self.source} ({self.events_before} events): "
            f"{self.kept_results} results kept, {self.lost_attempts} attempts lost with the "
            f"driver, {self.lost_results} results lost ({self.rerun_results} produced again), "
            f"{self.attempts_after} attempts deployed after the recovery"
        )


@dataclass(frozen=True)
class RunResult:
    job_id: str
    status: str  # SUCCEEDED, FAILED, CANCELED
    message: str
    started_ms: int
    finished_ms: int
    attempts: tuple[AttemptSummary, ...]
    parallelism: dict[str, tuple[int, str]]  # vertex -> (parallelism, decided_by)
    outputs: dict[str, str]  # sink vertex -> output location
    archive: str | None
    blocked: tuple[tuple[str, int, int], ...] = ()  # (host, from ms, until ms)
    commands_applied: int = 0
    commands_rejected: tuple[tuple[str, str, str], ...] = ()  # (id, type, reason)
    fallbacks: tuple[str, ...] = ()
    events_published: int = 0
    # chain -> the user's operators it ran, head first
    chains: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Per attempt, driver-measured: deploy sent -> outcome back, minus the runner's own run time
    # (the dispatch overhead), and deploy sent -> the runner's "started".
    dispatch_ms: tuple[float, ...] = ()
    deploy_to_running_ms: tuple[float, ...] = ()
    # Slot runners that ended during the job (executor lost, worker killed, cancel timeout).
    runners_lost: int = 0
    # Set when the run took over a job whose driver died.
    recovery: RecoverySummary | None = None
    # Producer chain -> the aggregation it ran the local phase of (two-phase aggregation).
    local_aggregation: dict[str, str] = field(default_factory=dict)
    # Producer chain -> the broadcast join it ran inside (never deployed alone, nothing written).
    fused: dict[str, str] = field(default_factory=dict)
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "SUCCEEDED"

    @property
    def duration_s(self) -> float:
        return (self.finished_ms - self.started_ms) / 1000.0

    @property
    def speculative_attempts(self) -> int:
        return sum(1 for a in self.attempts if a.speculative)

    @property
    def speculative_wins(self) -> int:
        return sum(1 for a in self.attempts if a.speculative and a.won)

    @property
    def restarts(self) -> int:
        """Attempts beyond the first of each subtask that were not speculative."""
        return sum(1 for a in self.attempts if a.attempt > 0 and not a.speculative)

    @property
    def failures(self) -> int:
        return sum(1 for a in self.attempts if a.status == "FAILED")

    def summary(self) -> str:
        lines = [
            f"job {self.job_id}: {self.status} in {self.duration_s:.1f} s"
            + (f" ({self.message})" if self.message else ""),
            *([self.recovery.line()] if self.recovery is not None else []),
            f"attempts: {len(self.attempts)} ({self.speculative_attempts} speculative, "
            f"{self.speculative_wins} of them won; {self.failures} failed, "
            f"{self.restarts} restarts)",
        ]
        for vertex, (p, by) in self.parallelism.items():
            lines.append(f"  {vertex}: parallelism {p} decided by {by}")
        for producer, operator in self.local_aggregation.items():
            lines.append(
                f"  {producer}: aggregated for {operator} before its exchange (two phases)"
            )
        for producer, join in self.fused.items():
            lines.append(
                f"  {producer}: ran inside {join}'s subtasks (the other side of a broadcast "
                "join: not shuffled, no partition files)"
            )
        spilled = [a for a in self.attempts if a.spilled_bytes]
        if spilled:
            total = sum(a.spilled_bytes for a in spilled) / 2**20
            lines.append(f"spilled to local disk: {total:.1f} MiB by {len(spilled)} attempts")
        if self.dispatch_ms:
            p50, p99 = percentile(self.dispatch_ms, 50), percentile(self.dispatch_ms, 99)
            lines.append(f"dispatch overhead: p50 {p50:.2f} ms, p99 {p99:.2f} ms")
        if self.blocked:
            for host, start, until in self.blocked:
                lines.append(f"blocked {host} for {(until - start) / 1000:.1f} s")
        else:
            lines.append("blocked hosts: none")
        lines.append(
            f"commands: {self.commands_applied} applied, {len(self.commands_rejected)} rejected"
        )
        for cid, ctype, reason in self.commands_rejected[:10]:
            lines.append(f"  rejected {ctype} {cid}: {reason}")
        for note in self.fallbacks:
            lines.append(f"fallback: {note}")
        for sink, where in self.outputs.items():
            lines.append(f"output {sink}: {where}")
        if self.archive:
            lines.append(f"archive: {self.archive}")
        return "\n".join(lines)
