"""What the failover core remembers about one job, built from the event stream alone."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from tailguard.failover.policy.backoff import RestartBackoff
from tailguard.model.config import Settings
from tailguard.model.records import InputRange, PartitionRef, SubtaskInputs, TaskRef
from tailguard.model.topology import ExecutionTopology, JobGraph


class AttemptState(enum.Enum):
    LIVE = "LIVE"
    FINISHED = "FINISHED"
    FAILED = "FAILED"
    CANCELED = "CANCELED"


@dataclass(frozen=True, slots=True)
class Result:
    """The first finished attempt of a subtask since its last restart: its partition."""

    attempt: int
    checksums: tuple[str, ...]


@dataclass(slots=True)
class TaskState:
    attempts: dict[int, AttemptState] = field(default_factory=dict)
    # Attempts numbered up to `floor` belong to before the last restart: their outcomes no
    # longer matter (they are being cancelled or were replaced).
    floor: int = -1
    # Restarts of this subtask so far; lets a deferred check tell whether the consumer that
    # read the old data is still the one running.
    generation: int = 0
    result: Result | None = None
    # USER error messages of this subtask's attempts -> the hosts they came from.
    user_errors: dict[str, set[str]] = field(default_factory=dict)

    def is_current(self, attempt: int) -> bool:
        return attempt > self.floor

    def live_attempts(self) -> list[int]:
        return [
            a for a, s in self.attempts.items() if s is AttemptState.LIVE and self.is_current(a)
        ]

    def has_run(self) -> bool:
        """A current attempt is running or finished: the subtask has consumed its inputs."""
        return any(
            self.is_current(a) and s in (AttemptState.LIVE, AttemptState.FINISHED)
            for a, s in self.attempts.items()
        )

    def restart(self) -> None:
        self.floor = max([self.floor, *self.attempts])
        self.generation += 1
        self.result = None

    def retire_known_attempts(self) -> None:
        """The restart was applied: every attempt known now is one the agent cancels."""
        self.floor = max([self.floor, *self.attempts])
        if self.result is not None and self.result.attempt <= self.floor:
            self.result = None


@dataclass(frozen=True, slots=True)
class DeferredCheck:
    """A consumer that read a restarted producer's old partition and was not restarted: when
    the producer's new result arrives, the consumer restarts only if what it read changed."""

    consumer: TaskRef
    consumer_generation: int
    # Subpartitions of the producer's partition the consumer reads; None: all of them.
    subpartitions: tuple[int, int] | None
    checksums: tuple[str, ...]
    cause: str


@dataclass(slots=True)
class JobState:
    settings: Settings
    graph: JobGraph
    backoff: RestartBackoff
    restart_consumers_always: bool
    parallelism: dict[str, int] = field(default_factory=dict)
    subtask_inputs: dict[str, tuple[SubtaskInputs, ...]] = field(default_factory=dict)
    tasks: dict[TaskRef, TaskState] = field(default_factory=dict)
    # Partitions the agent released: gone for every consumer.
    released: set[PartitionRef] = field(default_factory=set)
    # Subpartition ranges of a partition that consumers reported missing or corrupt (None: the
    # reporter's range is unknown, so the whole partition counts as damaged).
    reports: dict[PartitionRef, list[tuple[int, int] | None]] = field(default_factory=dict)
    # Per restarted producer: the checks of its consumers, by (consumer, consumer generation).
    deferred: dict[TaskRef, dict[tuple[TaskRef, int], DeferredCheck]] = field(default_factory=dict)
    restart_commands: dict[str, tuple[TaskRef, ...]] = field(default_factory=dict)
    failed: bool = False
    _topology: ExecutionTopology | None = None
    _ranges: dict[str, dict[int, tuple[InputRange, ...]]] = field(default_factory=dict)

    def task(self, ref: TaskRef) -> TaskState:
        state = self.tasks.get(ref)
        if state is None:
            state = self.tasks[ref] = TaskState()
        return state

    def topology(self) -> ExecutionTopology:
        if self._topology is None:
            self._topology = ExecutionTopology(self.graph, self.parallelism, self.subtask_inputs)
        return self._topology

    def initialize(self, vertex: str, parallelism: int, inputs: tuple[SubtaskInputs, ...]) -> None:
        self.parallelism[vertex] = parallelism
        self.subtask_inputs[vertex] = inputs
        self._ranges[vertex] = {entry.subtask: entry.inputs for entry in inputs}
        self._topology = None

    def partition(self, ref: TaskRef) -> PartitionRef | None:
        """The partition of the subtask's current result, if it has one."""
        result = self.task(ref).result
        return None if result is None else PartitionRef(ref.vertex, ref.subtask, result.attempt)

    def report_damage(self, reporter: TaskRef, partition: PartitionRef) -> None:
        producer = TaskRef(partition.vertex, partition.subtask)
        damaged = self.subpartitions_read(reporter, producer)
        self.reports.setdefault(partition, []).append(damaged)

    def damaged_producers(self) -> list[TaskRef]:
        """Subtasks whose current partition is no longer complete."""
        refs = self.released | set(p for p, damage in self.reports.items() if damage)
        return [
            task
            for task in (TaskRef(p.vertex, p.subtask) for p in refs)
            if self.needs_reproducing(task)
        ]

    def needs_reproducing(self, producer: TaskRef) -> bool:
        """The producer finished, but its partition is no longer complete."""
        partition = self.partition(producer)
        return partition is not None and (
            partition in self.released or bool(self.reports.get(partition))
        )

    def lost_for(self, consumer: TaskRef, producer: TaskRef) -> bool:
        """What `consumer` reads of the producer's current partition is gone: the partition
        was released or a report covers subpartitions the consumer reads."""
        partition = self.partition(producer)
        if partition is None:
            return False
        if partition in self.released:
            return True
        reads = self.subpartitions_read(consumer, producer)
        return any(_overlap(reads, damaged) for damaged in self.reports.get(partition, ()))

    def subpartitions_read(self, consumer: TaskRef, producer: TaskRef) -> tuple[int, int] | None:
        for r in self._ranges.get(consumer.vertex, {}).get(consumer.subtask, ()):
            if r.input == producer.vertex and (
                r.partition_start <= producer.subtask <= r.partition_end
            ):
                return (r.subpartition_start, r.subpartition_end)
        return None


def read_slice(
    checksums: tuple[str, ...], subpartitions: tuple[int, int] | None
) -> tuple[str, ...]:
    if subpartitions is None:
        return checksums
    start, end = subpartitions
    return checksums[start : end + 1]


def _overlap(a: tuple[int, int] | None, b: tuple[int, int] | None) -> bool:
    if a is None or b is None:
        return True
    return a[0] <= b[1] and b[0] <= a[1]
