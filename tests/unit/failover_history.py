"""A small agent simulator for the failover core's tests: builds events with sequential ids
and timestamps, feeds them to a `FailoverStrategy`, and applies its restarts the way the agent
does (CommandApplied first, then the live attempts of the restarted tasks are cancelled)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tailguard.failover.policy import FailoverStrategy
from tailguard.model.config import Settings
from tailguard.model.ids import event_id
from tailguard.model.records import (
    AttemptCanceled,
    AttemptDeploying,
    AttemptFailed,
    AttemptFinished,
    CancelReason,
    CommandApplied,
    ErrorKind,
    Event,
    JobFinished,
    JobGraphSpec,
    JobStatus,
    JobSubmitted,
    PartitionRef,
    PartitionReleased,
    Record,
    RestartTasks,
    SubtaskInputs,
    VertexInitialized,
)


@dataclass
class AgentSim:
    graph: JobGraphSpec
    config: dict[str, str] = field(default_factory=dict)
    job_id: str = "job-1"
    step_ms: int = 100
    core: FailoverStrategy = field(default_factory=lambda: FailoverStrategy(Settings()))
    ts: int = 0
    events: list[Event] = field(default_factory=list)
    outputs: list[Record] = field(default_factory=list)
    live: dict[tuple[str, int], set[int]] = field(default_factory=dict)
    next_attempt: dict[tuple[str, int], int] = field(default_factory=dict)
    hosts: dict[tuple[str, int, int], str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.emit(JobSubmitted, name="test", graph=self.graph, config=dict(self.config))

    # ------------------------------------------------------------ raw events

    def emit(self, cls: type[Event], at: int | None = None, **fields: Any) -> list[Record]:
        self.ts = self.ts + self.step_ms if at is None else at
        event = cls(
            job_id=self.job_id, ts=self.ts, id=event_id(self.job_id, len(self.events) + 1), **fields
        )
        self.events.append(event)
        out = self.core.handle(event)
        self.outputs.extend(out)
        return out

    # ------------------------------------------------------------ agent actions

    def init(self, vertex: str, parallelism: int, inputs: tuple[SubtaskInputs, ...] = ()) -> None:
        self.emit(
            VertexInitialized,
            vertex=vertex,
            parallelism=parallelism,
            subtask_inputs=inputs,
            decided_by="fixed",
        )

    def deploy(self, vertex: str, subtask: int, speculative: bool = False, host: str = "h1") -> int:
        key = (vertex, subtask)
        attempt = self.next_attempt.get(key, 0)
        self.next_attempt[key] = attempt + 1
        self.live.setdefault(key, set()).add(attempt)
        self.hosts[(vertex, subtask, attempt)] = host
        self.emit(
            AttemptDeploying,
            vertex=vertex,
            subtask=subtask,
            attempt=attempt,
            host=host,
            speculative=speculative,
        )
        return attempt

    def finish(
        self, vertex: str, subtask: int, attempt: int, checksums: tuple[str, ...] = ("c0",)
    ) -> list[Record]:
        self.live.get((vertex, subtask), set()).discard(attempt)
        return self.emit(
            AttemptFinished,
            vertex=vertex,
            subtask=subtask,
            attempt=attempt,
            host="h1",
            input_bytes=100,
            records=10,
            bytes_per_subpartition=tuple(10 for _ in checksums),
            checksums=checksums,
        )

    def run(self, vertex: str, subtask: int, checksums: tuple[str, ...] = ("c0",)) -> int:
        attempt = self.deploy(vertex, subtask)
        self.finish(vertex, subtask, attempt, checksums)
        return attempt

    def fail(
        self,
        vertex: str,
        subtask: int,
        attempt: int,
        error: ErrorKind = ErrorKind.USER,
        missing: PartitionRef | None = None,
        at: int | None = None,
        host: str | None = None,
        message: str = "boom",
        non_recoverable: bool = False,
    ) -> list[Record]:
        self.live.get((vertex, subtask), set()).discard(attempt)
        return self.emit(
            AttemptFailed,
            at=at,
            vertex=vertex,
            subtask=subtask,
            attempt=attempt,
            host=host or self.hosts.get((vertex, subtask, attempt), "h1"),
            error=error,
            message=message,
            missing_partition=missing,
            non_recoverable=non_recoverable,
        )

    def cancel(self, vertex: str, subtask: int, attempt: int, reason: CancelReason) -> None:
        self.live.get((vertex, subtask), set()).discard(attempt)
        self.emit(
            AttemptCanceled,
            vertex=vertex,
            subtask=subtask,
            attempt=attempt,
            host="h1",
            reason=reason,
        )

    def release(self, vertex: str, subtask: int, attempt: int) -> None:
        self.emit(PartitionReleased, partition=PartitionRef(vertex, subtask, attempt))

    def apply(self, command: Record) -> None:
        """What the agent does with a RestartTasks: confirm, then cancel the live attempts."""
        assert isinstance(command, RestartTasks)
        self.emit(CommandApplied, command_id=command.id, command_type="RestartTasks")
        for task in command.tasks:
            for attempt in sorted(self.live.get((task.vertex, task.subtask), set())):
                self.cancel(task.vertex, task.subtask, attempt, CancelReason.RESTART)

    def end(self, status: JobStatus = JobStatus.SUCCEEDED) -> None:
        self.emit(JobFinished, status=status)
