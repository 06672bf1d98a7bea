"""Record builders shared by the detector, speculator and blocklist tests.

`JobEvents` hands out a job's events with consecutive ids, as the agent does; `simulate` runs a
small closed-loop job (hosts of varying speed, attempts, failures, Ticks) through the three cores
in order, applying the speculator's and blocklist's commands the way the agent would.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from tailguard.blocklist.policy import BlocklistTracker
from tailguard.detector.policy import SlowTaskDetector
from tailguard.model.config import Settings
from tailguard.model.ids import event_id
from tailguard.model.records import (
    SPLITS_INPUT,
    AttemptCanceled,
    AttemptDeploying,
    AttemptFailed,
    AttemptFinished,
    AttemptProgress,
    BlockNodes,
    CancelReason,
    Distribution,
    EdgeSpec,
    ErrorKind,
    Event,
    InputRange,
    JobFinished,
    JobGraphSpec,
    JobStatus,
    JobSubmitted,
    LaunchSpeculativeAttempts,
    NodeAdded,
    Record,
    SlowSubtask,
    SlowTasksDetected,
    SubtaskInputs,
    Tick,
    UnblockNodes,
    VertexInitialized,
    VertexKind,
    VertexSpec,
)


def source(name: str, split_bytes: tuple[int, ...], safe: bool = True) -> VertexSpec:
    return VertexSpec(
        name=name, kind=VertexKind.SOURCE, split_bytes=split_bytes, speculation_safe=safe
    )


def operator(name: str, safe: bool = True) -> VertexSpec:
    return VertexSpec(name=name, kind=VertexKind.OPERATOR, speculation_safe=safe)


def one_split_each(n: int) -> tuple[SubtaskInputs, ...]:
    return tuple(SubtaskInputs(s, (InputRange(SPLITS_INPUT, s, s, 0, 0),)) for s in range(n))


class JobEvents:
    """The events of one job, with ids `<job>-e<n>` in order."""

    def __init__(self, job_id: str = "job") -> None:
        self.job_id = job_id
        self._sequence = 0

    def _ids(self, ts: int) -> dict[str, object]:
        self._sequence += 1
        return {"job_id": self.job_id, "ts": ts, "id": event_id(self.job_id, self._sequence)}

    def submitted(
        self,
        vertices: tuple[VertexSpec, ...],
        edges: tuple[EdgeSpec, ...] = (),
        config: dict[str, str] | None = None,
        ts: int = 0,
    ) -> JobSubmitted:
        return JobSubmitted(
            **self._ids(ts),  # type: ignore[arg-type]
            name=self.job_id,
            graph=JobGraphSpec(vertices, edges),
            config=config or {},
        )

    def node(self, host: str, ts: int = 0, slots: int = 1) -> NodeAdded:
        return NodeAdded(**self._ids(ts), host=host, slots=slots)  # type: ignore[arg-type]

    def initialized(
        self,
        vertex: str,
        inputs: tuple[SubtaskInputs, ...],
        ts: int = 0,
        parallelism: int | None = None,
    ) -> VertexInitialized:
        return VertexInitialized(
            **self._ids(ts),  # type: ignore[arg-type]
            vertex=vertex,
            parallelism=len(inputs) if parallelism is None else parallelism,
            subtask_inputs=inputs,
            decided_by="fixed",
        )

    def deploying(
        self,
        vertex: str,
        subtask: int,
        ts: int,
        host: str = "h0",
        attempt: int = 0,
        speculative: bool = False,
    ) -> AttemptDeploying:
        return AttemptDeploying(
            **self._ids(ts),  # type: ignore[arg-type]
            vertex=vertex,
            subtask=subtask,
            attempt=attempt,
            host=host,
            speculative=speculative,
        )

    def finished(
        self,
        vertex: str,
        subtask: int,
        ts: int,
        host: str = "h0",
        attempt: int = 0,
        input_bytes: int | None = None,
        bytes_per_subpartition: tuple[int, ...] = (),
    ) -> AttemptFinished:
        return AttemptFinished(
            **self._ids(ts),  # type: ignore[arg-type]
            vertex=vertex,
            subtask=subtask,
            attempt=attempt,
            host=host,
            input_bytes=input_bytes,
            records=1,
            bytes_per_subpartition=bytes_per_subpartition,
            checksums=(),
        )

    def progress(
        self,
        vertex: str,
        subtask: int,
        ts: int,
        bytes_read: int,
        bytes_total: int | None = None,
        host: str = "h0",
        attempt: int = 0,
    ) -> AttemptProgress:
        return AttemptProgress(
            **self._ids(ts),  # type: ignore[arg-type]
            vertex=vertex,
            subtask=subtask,
            attempt=attempt,
            host=host,
            records_read=bytes_read // 100,
            bytes_read=bytes_read,
            bytes_total=bytes_total,
        )

    def failed(
        self, vertex: str, subtask: int, ts: int, host: str = "h0", attempt: int = 0
    ) -> AttemptFailed:
        return AttemptFailed(
            **self._ids(ts),  # type: ignore[arg-type]
            vertex=vertex,
            subtask=subtask,
            attempt=attempt,
            host=host,
            error=ErrorKind.INFRA,
            message="lost",
        )

    def canceled(
        self, vertex: str, subtask: int, ts: int, host: str = "h0", attempt: int = 0
    ) -> AttemptCanceled:
        return AttemptCanceled(
            **self._ids(ts),  # type: ignore[arg-type]
            vertex=vertex,
            subtask=subtask,
            attempt=attempt,
            host=host,
            reason=CancelReason.LOST_RACE,
        )

    def tick(self, ts: int) -> Tick:
        return Tick(**self._ids(ts))  # type: ignore[arg-type]

    def job_finished(self, ts: int) -> JobFinished:
        return JobFinished(**self._ids(ts), status=JobStatus.SUCCEEDED)  # type: ignore[arg-type]


def slow_finding(
    *subtasks: SlowSubtask,
    job_id: str = "job",
    ts: int = 0,
    vertex: str = "v",
    hosts: tuple[str, ...] = ("h0", "h1", "h2", "h3"),
    safe: bool = True,
    finding_id: str | None = None,
) -> SlowTasksDetected:
    return SlowTasksDetected(
        job_id=job_id,
        ts=ts,
        id=finding_id or f"f-{job_id}-{vertex}-{ts}",
        vertex=vertex,
        speculation_safe=safe,
        baseline_ms=1000,
        baseline_ns_per_byte=None,
        slow=subtasks,
        hosts=hosts,
    )


# --------------------------------------------------------------------------- closed-loop job


@dataclass(frozen=True)
class SimulationParams:
    seed: int
    sources: int = 12
    consumers: int = 6
    hosts: int = 6
    slow_hosts: int = 1
    failure_rate: float = 0.02
    ticks: int = 120


@dataclass
class SimulationRun:
    events: list[Event] = field(default_factory=list)
    findings: list[Record] = field(default_factory=list)
    commands: list[Record] = field(default_factory=list)
    # Largest number of attempts of one subtask alive at the same time.
    max_live_per_subtask: int = 0
    # (ts, registered hosts, hosts blocked at that instant) after each finding.
    block_samples: list[tuple[int, int, int]] = field(default_factory=list)


# Small enough that short simulated jobs reach the slow rule.
SIMULATION_CONFIG = {"slow-task-detector.execution-time.baseline-lower-bound": "3 s"}


# How long the simulated agent takes to place a speculative attempt: two Ticks.
LAUNCH_DELAY_MS = 2000


def simulate(params: SimulationParams, settings: Settings | None = None) -> SimulationRun:
    """Run a two-vertex job (source -> ALL_TO_ALL consumer) through detector -> speculator ->
    blocklist, applying their commands as the agent would."""
    from tailguard.speculator.policy import SpeculationStrategy

    settings = settings or Settings()
    max_concurrent = settings.integer("execution.batch.speculative.max-concurrent-executions")
    rng = random.Random(params.seed)
    run = SimulationRun()
    detector = SlowTaskDetector(settings)
    speculator = SpeculationStrategy(settings)
    blocklist = BlocklistTracker(settings)
    ev = JobEvents("sim")
    hosts = [f"h{i}" for i in range(params.hosts)]
    speed = {h: (5.0 if i < params.slow_hosts else 1.0) for i, h in enumerate(hosts)}
    blocked: dict[str, int] = {}
    busy: dict[str, int] = dict.fromkeys(hosts, 0)
    # (vertex, subtask) -> attempt -> (host, end ts, speculative)
    live: dict[tuple[str, int], dict[int, tuple[str, int, bool]]] = {}
    next_attempt: dict[tuple[str, int], int] = {}
    done: set[tuple[str, int]] = set()
    pending: list[tuple[str, int]] = [("src", s) for s in range(params.sources)]
    split_bytes = tuple(rng.randint(1, 8) * 1_000_000 for _ in range(params.sources))
    assigned: dict[tuple[str, int], int] = {("src", s): b for s, b in enumerate(split_bytes)}
    subpartitions = params.consumers
    now = 0
    applied: set[str] = set()
    launches: list[tuple[int, LaunchSpeculativeAttempts]] = []
    # (vertex, subtask, attempt) -> deploying ts, for progress reports.
    started: dict[tuple[str, int, int], int] = {}
    # The slot runners report progress; the histories carry it when a rule reads it.
    reports_progress = settings.flag("slow-task-detector.progress-rate.enabled") or settings.flag(
        "slow-task-detector.slow-host.enabled"
    )

    def emit(event: Event) -> None:
        run.events.append(event)
        for finding in detector.handle(event):
            run.findings.append(finding)
            commands = speculator.handle(finding) + blocklist.handle(finding)
            for command in commands:
                run.commands.append(command)
                apply(command)
            if isinstance(finding, SlowTasksDetected):
                active = sum(
                    1 for h, until in blocked.items() if until > finding.ts and h in finding.hosts
                )
                run.block_samples.append((finding.ts, len(finding.hosts), active))

    def free_hosts(avoid: tuple[str, ...] = ()) -> list[str]:
        return [h for h in hosts if busy[h] < 2 and blocked.get(h, 0) <= now and h not in avoid]

    def deploy(task: tuple[str, int], host: str, speculative: bool) -> None:
        attempt = next_attempt.get(task, 0)
        next_attempt[task] = attempt + 1
        duration = int(assigned[task] / 1_000_000 * 1000 * speed[host]) + rng.randint(0, 300)
        live.setdefault(task, {})[attempt] = (host, now + duration, speculative)
        started[(task[0], task[1], attempt)] = now
        busy[host] += 1
        run.max_live_per_subtask = max(run.max_live_per_subtask, len(live[task]))
        emit(ev.deploying(task[0], task[1], now, host, attempt, speculative))

    def apply(command: Record) -> None:
        if command.id in applied:
            return
        applied.add(command.id)
        if isinstance(command, LaunchSpeculativeAttempts):
            # The agent's guard (`_guard_speculate` in agent/driver/commands.py): the running
            # and queued attempts and those asked for must stay within max-concurrent, or the
            # command is rejected. The speculator cannot see a copy it asked for an attempt
            # that has since failed and been restarted: that copy is still queued.
            task = (command.vertex, command.subtask)
            queued = sum(c.count for _, c in launches if (c.vertex, c.subtask) == task)
            if len(live.get(task, {})) + queued + command.count > max_concurrent:
                return
            # The agent places speculative attempts asynchronously: findings of the same state
            # may come in before, which the speculator must not answer again.
            launches.append((now, command))
        elif isinstance(command, BlockNodes):
            for h in command.hosts:
                blocked[h] = command.until_ts
        elif isinstance(command, UnblockNodes):
            for h in command.hosts:
                blocked.pop(h, None)

    def launch(command: LaunchSpeculativeAttempts) -> None:
        task = (command.vertex, command.subtask)
        if task in done or task not in live:
            return
        for host in free_hosts(command.avoid_hosts)[: command.count]:
            deploy(task, host, True)

    emit(
        ev.submitted(
            (source("src", split_bytes), operator("sink")),
            (EdgeSpec("src", "sink", Distribution.ALL_TO_ALL),),
            SIMULATION_CONFIG,
        )
    )
    for h in hosts:
        emit(ev.node(h, 0, 2))
    emit(ev.initialized("src", one_split_each(params.sources)))
    sink_ready = False
    for _ in range(params.ticks):
        now += 1000
        for task in sorted(live):
            for attempt, (host, end, _spec) in sorted(live[task].items()):
                if task not in live or attempt not in live[task]:
                    continue
                if end <= now and task not in done:
                    del live[task][attempt]
                    busy[host] -= 1
                    done.add(task)
                    per_sub = (assigned[task] // subpartitions,) * subpartitions
                    emit(ev.finished(task[0], task[1], now, host, attempt, assigned[task], per_sub))
                    for other, (other_host, _, _) in sorted(live[task].items()):
                        busy[other_host] -= 1
                        emit(ev.canceled(task[0], task[1], now, other_host, other))
                    live[task].clear()
                elif rng.random() < params.failure_rate:
                    del live[task][attempt]
                    busy[host] -= 1
                    emit(ev.failed(task[0], task[1], now, host, attempt))
                    if not live[task]:
                        pending.append(task)
            if task in live and not live[task]:
                del live[task]
        if not sink_ready and all(("src", s) in done for s in range(params.sources)):
            sink_ready = True
            total = sum(split_bytes)
            inputs = []
            for c in range(params.consumers):
                inputs.append(SubtaskInputs(c, (InputRange("src", 0, params.sources - 1, c, c),)))
                assigned[("sink", c)] = max(1, total // subpartitions)
            emit(ev.initialized("sink", tuple(inputs), now))
            pending.extend(("sink", c) for c in range(params.consumers))
        while launches and launches[0][0] <= now - LAUNCH_DELAY_MS:
            launch(launches.pop(0)[1])
        while pending and free_hosts():
            task = pending.pop(0)
            deploy(task, rng.choice(free_hosts()), False)
        if reports_progress:
            # Each live attempt reports how far it has read (linear progress), as the slot
            # runners do every check interval.
            for task in sorted(live):
                for attempt, (host, end, _spec) in sorted(live[task].items()):
                    start = started[(task[0], task[1], attempt)]
                    total = assigned[task]
                    read = total * (now - start) // max(1, end - start)
                    emit(ev.progress(task[0], task[1], now, min(read, total), total, host, attempt))
        emit(ev.tick(now))
        if sink_ready and len(done) == params.sources + params.consumers:
            break
    emit(ev.job_finished(now))
    return run
