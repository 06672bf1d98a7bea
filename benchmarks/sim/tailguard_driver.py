"""tailguard's real policy cores at simulated time, driven the way the agent drives them.

The simulated agent publishes the events the real one would — `JobSubmitted` with the graph,
`NodeAdded`, `VertexInitialized` with each subtask's inputs (source splits, then POINTWISE
producer ranges whose output bytes add up to the consumer's drawn input), `AttemptDeploying`,
`AttemptFinished` with input bytes, `AttemptCanceled` (LOST_RACE), `NodeBlocked` /
`NodeUnblocked` and a `Tick` every check interval — through detector -> speculator + blocklist,
and applies their commands: mirrors are placed away from the avoided and the blocked hosts
(waiting for a slot if none is free), blocked hosts get no new attempt until their block
expires. Commands reach the agent `command_latency_ms` after the finding (the Kafka round
trips); `CommandApplied` acknowledgements are not simulated (no core reads them).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from itertools import pairwise

from sim.engine import Attempt, Policy, Simulation, Task
from sim.scenario import consumer_ranges
from tailguard.agent.driver.ordering import subtask_order
from tailguard.blocklist.policy import BlocklistTracker
from tailguard.detector.policy import SlowTaskDetector
from tailguard.model.config import FLIP_168, Settings
from tailguard.model.ids import event_id
from tailguard.model.records import (
    SPLITS_INPUT,
    AttemptCanceled,
    AttemptDeploying,
    AttemptFinished,
    AttemptProgress,
    BlockNodes,
    CancelReason,
    Distribution,
    EdgeSpec,
    Event,
    InputRange,
    JobFinished,
    JobGraphSpec,
    JobStatus,
    JobSubmitted,
    LaunchSpeculativeAttempts,
    NodeAdded,
    NodeBlocked,
    NodeUnblocked,
    Record,
    SubtaskInputs,
    Tick,
    UnblockNodes,
    VertexInitialized,
    VertexKind,
    VertexSpec,
)
from tailguard.speculator.policy import SpeculationStrategy

JOB = "sim"

# Chosen for tasks of ~20 s (the default scenario). The lower bound is the knob that keeps
# ordinary noise from being called slow: at twice the median task time a normal attempt almost
# never reaches it (tasks slow from skew are exempt by the per-byte rule anyway), while one on a
# 3-8x slower host does, about half-way. Flink's 1 min default is meant for tasks of minutes.
SIMULATION_SETTINGS: dict[str, str] = {
    "slow-task-detector.check-interval": "1 s",
    "slow-task-detector.execution-time.baseline-ratio": "0.75",
    "slow-task-detector.execution-time.baseline-multiplier": "1.5",
    "slow-task-detector.execution-time.baseline-lower-bound": "40 s",
    "execution.batch.speculative.max-concurrent-executions": "2",
    "execution.batch.speculative.block-slow-node-duration": "1 min",
    "blocklist.max-blocked-fraction": "0.5",
}


@dataclass
class _Launch:
    ready_ts: int
    task: Task
    count: int
    avoid: frozenset[int]
    placed: int = field(default=0)


# The contenders built on tailguard's cores, by name: their settings on top of
# SIMULATION_SETTINGS (a `--set` applies to all of them).
VARIANTS: dict[str, dict[str, str]] = {
    # FLIP-168's rules exactly: Flink's detector, every slow attempt's host blocked.
    "tailguard-flip168": dict(FLIP_168),
    # tailguard's defaults: Flink's rule and the slow-host rule, the evidence-based blocklist.
    "tailguard": {},
    # Flink's rule with the evidence-based blocklist (tailguard's defaults before issue 24).
    "tailguard-flink": {"slow-task-detector.slow-host.enabled": "false"},
    # The progress-rate rule on top, with the evidence-based blocklist.
    "tailguard-progress": {"slow-task-detector.progress-rate.enabled": "true"},
    # ...with the agent starting each stage's largest subtasks first (LPT by input bytes).
    "tailguard-progress-lpt": {
        "slow-task-detector.progress-rate.enabled": "true",
        "scheduler.subtask-order": "largest-input-first",
    },
}

# How often the simulated slot runners report progress for the progress-rate rule alone. The
# agent reports at least every check interval; for that rule the simulator reports every 5 s to
# stay fast (detection can only be later for it), and only for attempts past the rule's minimum
# elapsed time (earlier reports are never read). The slow-host rule counts reports, so with it
# every running attempt reports every check interval, as the agent's runners do.
PROGRESS_INTERVAL_MS = 5_000


class TailguardPolicy(Policy):
    name = "tailguard"

    def __init__(
        self,
        overrides: dict[str, str] | None = None,
        command_latency_ms: int = 100,
        variant: str = "tailguard",
    ) -> None:
        self.name = variant
        self.config = {**SIMULATION_SETTINGS, **VARIANTS[variant], **(overrides or {})}
        self.settings = Settings(self.config)
        self.interval_ms = self.settings.duration_ms("slow-task-detector.check-interval")
        self.command_latency_ms = command_latency_ms
        self.subtask_order = subtask_order(self.settings)
        self.reports_progress = self.settings.flag("slow-task-detector.progress-rate.enabled")
        self.min_elapsed_ms = self.settings.duration_ms(
            "slow-task-detector.progress-rate.min-elapsed"
        )
        self.report_every_ms = PROGRESS_INTERVAL_MS
        if self.settings.flag("slow-task-detector.slow-host.enabled"):
            self.reports_progress = True
            self.report_every_ms = self.interval_ms
            self.min_elapsed_ms = 0
        self._next_report = 0
        self.detector = SlowTaskDetector(self.settings)
        self.speculator = SpeculationStrategy(self.settings)
        self.blocklist = BlocklistTracker(self.settings)
        self.events = 0
        self.findings = 0
        self.commands = 0
        self._sequence = 0
        self._names: list[str] = []
        self._host_index: dict[str, int] = {}
        # host -> ts its block ends (what the agent holds)
        self.blocked_until: dict[int, int] = {}
        self._ever_blocked: dict[int, None] = {}
        self._launches: deque[_Launch] = deque()

    def describe(self) -> str:
        keys = ", ".join(f"{k}={v}" for k, v in self.config.items())
        return f"{self.name} {keys}; command latency {self.command_latency_ms} ms"

    # ------------------------------------------------------------------ event plumbing

    def _ids(self) -> dict[str, object]:
        self._sequence += 1
        return {"job_id": JOB, "ts": self.sim.now, "id": event_id(JOB, self._sequence)}

    def _emit(self, event: Event) -> None:
        self.events += 1
        for finding in self.detector.handle(event):
            self.findings += 1
            for command in self.speculator.handle(finding) + self.blocklist.handle(finding):
                self.commands += 1
                self._apply(command)

    def _apply(self, command: Record) -> None:
        if isinstance(command, LaunchSpeculativeAttempts):
            task = self.sim.stages[int(command.vertex.removeprefix("stage"))][command.subtask]
            avoid = frozenset(self._host_index[h] for h in command.avoid_hosts)
            self.sim.asked(task)
            ready = self.sim.now + self.command_latency_ms
            self._launches.append(_Launch(ready, task, command.count, avoid))
            self.sim.wake_at(ready)
        elif isinstance(command, BlockNodes):
            for name in command.hosts:
                host = self._host_index[name]
                self.blocked_until[host] = command.until_ts
                self._ever_blocked[host] = None
                self._emit(
                    NodeBlocked(
                        **self._ids(),  # type: ignore[arg-type]
                        host=name,
                        until_ts=command.until_ts,
                        cause=command.cause,
                        command_id=command.id,
                    )
                )
        elif isinstance(command, UnblockNodes):
            for name in command.hosts:
                host = self._host_index[name]
                if self.blocked_until.pop(host, None) is not None:
                    self.sim.unpark(host)
                    self._emit(NodeUnblocked(**self._ids(), host=name, command_id=command.id))  # type: ignore[arg-type]

    # ------------------------------------------------------------------ hooks

    def attach(self, sim: Simulation) -> None:
        super().attach(sim)
        scenario = sim.scenario
        self._names = [f"host-{h:04d}" for h in range(scenario.params.hosts)]
        self._host_index = {name: h for h, name in enumerate(self._names)}
        stages = scenario.stages
        vertices = [
            VertexSpec(
                stages[0].name,
                VertexKind.SOURCE,
                parallelism=stages[0].parallelism,
                split_bytes=stages[0].input_bytes,
            )
        ]
        vertices += [
            VertexSpec(
                s.name,
                VertexKind.SINK if s.index == len(stages) - 1 else VertexKind.OPERATOR,
                parallelism=s.parallelism,
            )
            for s in stages[1:]
        ]
        edges = tuple(EdgeSpec(a.name, b.name, Distribution.POINTWISE) for a, b in pairwise(stages))
        self._emit(
            JobSubmitted(
                **self._ids(),  # type: ignore[arg-type]
                name=JOB,
                graph=JobGraphSpec(tuple(vertices), edges),
                config=dict(self.config),
            )
        )
        for name in self._names:
            self._emit(NodeAdded(**self._ids(), host=name, slots=scenario.params.slots))  # type: ignore[arg-type]

    def stage_started(self, stage: int) -> None:
        stages = self.sim.scenario.stages
        current = stages[stage]
        if stage == 0:
            inputs = tuple(
                SubtaskInputs(s, (InputRange(SPLITS_INPUT, s, s, 0, 0),))
                for s in range(current.parallelism)
            )
        else:
            producer = stages[stage - 1]
            ranges = consumer_ranges(producer.parallelism, current.parallelism)
            inputs = tuple(
                SubtaskInputs(s, (InputRange(producer.name, lo, hi, 0, 0),))
                for s, (lo, hi) in enumerate(ranges)
            )
        self._emit(
            VertexInitialized(
                **self._ids(),  # type: ignore[arg-type]
                vertex=current.name,
                parallelism=current.parallelism,
                subtask_inputs=inputs,
                decided_by="fixed",
            )
        )

    def deployed(self, attempt: Attempt) -> None:
        task = attempt.task
        self._emit(
            AttemptDeploying(
                **self._ids(),  # type: ignore[arg-type]
                vertex=self.sim.scenario.stages[task.stage].name,
                subtask=task.subtask,
                attempt=attempt.number,
                host=self._names[attempt.host],
                speculative=attempt.speculative,
            )
        )

    def finished(self, attempt: Attempt) -> None:
        task = attempt.task
        stage = self.sim.scenario.stages[task.stage]
        size = stage.input_bytes[task.subtask]
        self._emit(
            AttemptFinished(
                **self._ids(),  # type: ignore[arg-type]
                vertex=stage.name,
                subtask=task.subtask,
                attempt=attempt.number,
                host=self._names[attempt.host],
                input_bytes=size,
                records=size // 100,
                bytes_per_subpartition=(stage.output_bytes[task.subtask],),
                checksums=(),
            )
        )

    def canceled(self, attempt: Attempt) -> None:
        task = attempt.task
        self._emit(
            AttemptCanceled(
                **self._ids(),  # type: ignore[arg-type]
                vertex=self.sim.scenario.stages[task.stage].name,
                subtask=task.subtask,
                attempt=attempt.number,
                host=self._names[attempt.host],
                reason=CancelReason.LOST_RACE,
            )
        )

    def check(self) -> None:
        now = self.sim.now
        # The agent lifts a block when its time is up, and says so.
        expired = sorted(h for h, until in self.blocked_until.items() if until <= now)
        for host in expired:
            del self.blocked_until[host]
            self.sim.unpark(host)
            self._emit(NodeUnblocked(**self._ids(), host=self._names[host]))  # type: ignore[arg-type]
        if self.reports_progress and now >= self._next_report:
            self._next_report = now + self.report_every_ms
            self._report_progress(now)
        self._emit(Tick(**self._ids()))  # type: ignore[arg-type]

    def _report_progress(self, now: int) -> None:
        """What the slot runners report: bytes read so far, progress linear in time."""
        stages = self.sim.scenario.stages
        for attempt in self.sim.running:
            elapsed = now - attempt.start
            if elapsed < self.min_elapsed_ms:
                continue
            task = attempt.task
            stage = stages[task.stage]
            total = stage.input_bytes[task.subtask]
            read = min(total, total * elapsed // max(1, attempt.duration))
            self._emit(
                AttemptProgress(
                    **self._ids(),  # type: ignore[arg-type]
                    vertex=stage.name,
                    subtask=task.subtask,
                    attempt=attempt.number,
                    host=self._names[attempt.host],
                    records_read=read // 100,
                    bytes_read=read,
                    bytes_total=total,
                )
            )

    def job_finished(self) -> None:
        self._emit(JobFinished(**self._ids(), status=JobStatus.SUCCEEDED))  # type: ignore[arg-type]

    blocks_hosts = True

    def blocked(self, host: int) -> bool:
        return self.blocked_until.get(host, 0) > self.sim.now

    def hosts_blocked(self) -> tuple[int, ...]:
        return tuple(self._ever_blocked)

    def wants_slots(self) -> bool:
        return bool(self._launches) and self._launches[0].ready_ts <= self.sim.now

    def place_speculative(self) -> None:
        """Ready launches in arrival order; one that finds no acceptable slot waits (later ones
        may still fit elsewhere, so they are tried too)."""
        sim = self.sim
        now = sim.now
        waiting: deque[_Launch] = deque()
        while self._launches and self._launches[0].ready_ts <= now:
            launch = self._launches.popleft()
            task = launch.task
            if task.done:
                continue  # the agent would answer CommandRejected: nothing left to mirror
            while launch.placed < launch.count and sim.free:
                refused = launch.avoid | {a.host for a in task.live}
                host = sim.take_slot(refused.__contains__)
                if host is None:
                    break
                sim.deploy(task, host, True)
                launch.placed += 1
            if launch.placed < launch.count:
                waiting.append(launch)
        waiting.extend(self._launches)
        self._launches = waiting
