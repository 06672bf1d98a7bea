"""The agent's view of a running job: vertices, subtasks, attempts, partitions.

Plain bookkeeping with no Spark, Kafka or clock in it, so the scheduling rules can be tested on
their own. The runner drives it and turns its changes into events.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field

from tailguard.agent.driver.broadcast_joins import BroadcastJoins
from tailguard.agent.driver.local_aggregation import LocalAggregation
from tailguard.agent.driver.slots import (
    ExecutionVertexId,
    RegionRequest,
    RequestKey,
    SlotRequest,
    TaskRequest,
)
from tailguard.agent.executor.attempt import AttemptKey, AttemptOutcome
from tailguard.agent.graph.api import pipelined_groups
from tailguard.agent.graph.chaining import ChainDef, ChainedJob
from tailguard.decider.policy.broadcast_join import (
    BROADCAST_OFF,
    BroadcastJoinParams,
    other_side,
)
from tailguard.decider.policy.flink import pointwise_subpartitions
from tailguard.model.records import (
    SPLITS_INPUT,
    Distribution,
    InputRange,
    PartitionRef,
    SubtaskInputs,
)
from tailguard.model.topology import ExecutionTopology, JobGraph

# An execution vertex: (chain name, subtask index).
Task = ExecutionVertexId


class AttemptStatus(enum.Enum):
    DEPLOYING = "DEPLOYING"
    FINISHED = "FINISHED"
    FAILED = "FAILED"
    CANCELED = "CANCELED"


@dataclass
class Attempt:
    vertex: str
    subtask: int
    number: int
    host: str
    speculative: bool
    command_id: str | None
    deployed_at: int
    # The runner it was deployed to.
    slot: str | None = None
    status: AttemptStatus = AttemptStatus.DEPLOYING
    finished_at: int | None = None
    outcome: AttemptOutcome | None = None
    # Set when the agent asked Spark to cancel it, so its late outcome is discarded.
    cancel_reason: str | None = None

    @property
    def key(self) -> AttemptKey:
        return AttemptKey(self.vertex, self.subtask, self.number)

    @property
    def live(self) -> bool:
        return self.status is AttemptStatus.DEPLOYING and self.cancel_reason is None


@dataclass
class Subtask:
    vertex: str
    index: int
    inputs: tuple[InputRange, ...]
    attempts: list[Attempt] = field(default_factory=list)
    winner: Attempt | None = None
    # The partition of the winner is readable (not released or reported missing).
    available: bool = False
    # Needs a (new) attempt: set at initialisation and by restarts.
    wanted: bool = True
    not_before: int = 0
    committed: bool = False

    def live_attempts(self) -> list[Attempt]:
        return [a for a in self.attempts if a.live]

    def next_number(self) -> int:
        return len(self.attempts)

    def win(self, attempt: Attempt) -> None:
        """`attempt` finished first: its partition is the subtask's result."""
        attempt.status = AttemptStatus.FINISHED
        self.winner = attempt
        self.available = True
        self.wanted = False

    def unfinish(self) -> None:
        """Its result is gone or no longer counts (a restart, a failed sink commit, a result
        lost with a driver): it needs a new attempt."""
        self.winner = None
        self.available = False
        self.committed = False
        self.wanted = True


@dataclass
class Vertex:
    definition: ChainDef
    parallelism: int | None = None
    decided_by: str | None = None
    subtasks: list[Subtask] = field(default_factory=list)
    # How many subpartitions each of its result partitions has (set by its consumers' needs).
    subpartitions: int = 1

    @property
    def name(self) -> str:
        return self.definition.name

    @property
    def initialized(self) -> bool:
        return self.parallelism is not None

    def finished(self) -> bool:
        return self.initialized and all(s.winner is not None for s in self.subtasks)


class ExecutionState:
    """Vertices in topological order, initialised lazily (FLIP-187's dynamic graph)."""

    def __init__(
        self,
        job: ChainedJob,
        default_max_parallelism: int,
        broadcast: BroadcastJoinParams = BROADCAST_OFF,
        agg_phase: str = "AUTO",
    ) -> None:
        self.job = job
        self.default_max_parallelism = default_max_parallelism
        # The adaptive broadcast join's order of production and decisions (broadcast_joins.py).
        self.broadcast_joins = BroadcastJoins(job, broadcast)
        self.vertices: dict[str, Vertex] = {name: Vertex(v) for name, v in job.vertices.items()}
        self.consumers: dict[str, list[tuple[str, int]]] = {name: [] for name in job.vertices}
        for v in job.vertices.values():
            for index, i in enumerate(v.inputs):
                self.consumers[i.producer].append((v.name, index))
        # Which producers aggregate before their exchange (local_aggregation.py).
        self.local_aggregation = LocalAggregation(job, self.consumers, agg_phase)
        for vertex in self.vertices.values():
            vertex.subpartitions = self._subpartitions_of(vertex.name)
        self.pipelined_groups = pipelined_groups(job)
        self._graph = JobGraph(job.spec()) if self.pipelined_groups else None
        # Each task of a pipelined region with more than one task -> the region's tasks,
        # producers before consumers. Tasks alone in their region are not listed.
        self.regions: dict[Task, tuple[Task, ...]] = {}

    def max_parallelism(self, name: str) -> int:
        return self.vertices[name].definition.max_parallelism or self.default_max_parallelism

    def _subpartitions_of(self, producer: str) -> int:
        """ALL_TO_ALL consumers read ranges of max-parallelism subpartitions (FLIP-187);
        POINTWISE consumers runs of (partition, subpartition) slices, enough of them to reach
        their parallelism (`pointwise_subpartitions`, known once the producer's parallelism
        is); FORWARD and BROADCAST consumers read whole partitions: one subpartition."""
        if self._unsplit(producer):
            return 1  # its one consumer, a broadcast join, reads it as it is
        counts = {1}
        producers = self.vertices[producer].parallelism
        for consumer, index in self.consumers[producer]:
            distribution = self.job.vertices[consumer].inputs[index].distribution
            if distribution is Distribution.ALL_TO_ALL:
                counts.add(self.max_parallelism(consumer))
            elif distribution is Distribution.POINTWISE and producers is not None:
                reach = self.job.vertices[consumer].parallelism or self.max_parallelism(consumer)
                counts.add(pointwise_subpartitions(reach, producers))
        return max(counts)

    def _unsplit(self, producer: str) -> bool:
        """The other side of a broadcast join decided before it started: written unshuffled,
        or fused into the join (`fused`), it is never split for its consumer."""
        joins = self.broadcast_joins
        return producer in joins.unshuffled or producer in joins.fused

    def fused(self, name: str) -> bool:
        """Whether the vertex runs inside its broadcast join's subtasks, never on its own
        (broadcast_joins.py): nothing of it is deployed, written or waited for."""
        return name in self.broadcast_joins.fused

    def output_distribution(self, producer: str) -> tuple[Distribution, tuple[str, ...]]:
        if self._unsplit(producer):
            return Distribution.FORWARD, ()
        for consumer, index in self.consumers[producer]:
            definition = self.job.vertices[consumer].inputs[index]
            if definition.distribution is Distribution.ALL_TO_ALL:
                return definition.distribution, definition.keys
        return Distribution.FORWARD, ()

    def initialize(
        self, name: str, parallelism: int, subtask_inputs: tuple[SubtaskInputs, ...], by: str
    ) -> None:
        vertex = self.vertices[name]
        by_index = {s.subtask: s.inputs for s in subtask_inputs}
        vertex.parallelism = parallelism
        vertex.decided_by = by
        vertex.subpartitions = self._subpartitions_of(name)
        vertex.subtasks = [Subtask(name, k, by_index.get(k, ())) for k in range(parallelism)]
        for group in self.pipelined_groups:
            if name in group and all(self.vertices[v].initialized for v in group):
                self._add_regions(group)

    def _add_regions(self, group: tuple[str, ...]) -> None:
        """Regions of one pipelined group, computed once when its last vertex is initialised.

        Only the group's vertices enter the topology: the job validation guarantees no blocking
        path joins two of them, so no region spans groups and no cycle of regions needs merging.
        """
        assert self._graph is not None
        parallelisms: dict[str, int] = {}
        inputs: dict[str, tuple[SubtaskInputs, ...]] = {}
        for name in group:
            vertex = self.vertices[name]
            assert vertex.parallelism is not None
            parallelisms[name] = vertex.parallelism
            inputs[name] = tuple(SubtaskInputs(s.index, s.inputs) for s in vertex.subtasks)
        for region in ExecutionTopology(self._graph, parallelisms, inputs).regions():
            if len(region.tasks) > 1:
                tasks = tuple(ExecutionVertexId(t.vertex, t.subtask) for t in region.tasks)
                for task in tasks:
                    self.regions[task] = tasks

    def region_of(self, vertex: str, index: int) -> tuple[Task, ...] | None:
        """The tasks of the multi-task pipelined region holding the subtask, or None."""
        return self.regions.get(ExecutionVertexId(vertex, index))

    def subtask(self, vertex: str, index: int) -> Subtask | None:
        v = self.vertices.get(vertex)
        if v is None or not v.initialized or not 0 <= index < len(v.subtasks):
            return None
        return v.subtasks[index]

    def mark_unavailable(self, partition: PartitionRef) -> None:
        """The partition can no longer be read (released, or reported missing); only the
        current winner's partition counts."""
        producer = self.subtask(partition.vertex, partition.subtask)
        winner = producer.winner if producer is not None else None
        if producer is not None and winner is not None and winner.number == partition.attempt:
            producer.available = False

    def inputs_available(self, subtask: Subtask, together: frozenset[Task] = frozenset()) -> bool:
        """Vertex-wise scheduling: every partition the subtask consumes is available, except
        those of the producers in `together` (deployed with it in one bulk). A fused
        producer's partitions are made inside the subtask from its source splits (only a
        producer that reads no other's output is fused: `other_side`), so they always are."""
        for r in subtask.inputs:
            if r.input == SPLITS_INPUT:
                continue
            producer = self.vertices[r.input]
            if not producer.initialized:
                return False
            if self.fused(r.input):
                continue
            for p in range(r.partition_start, r.partition_end + 1):
                if (r.input, p) in together:
                    continue
                if p >= len(producer.subtasks) or not producer.subtasks[p].available:
                    return False
        return True

    def deployable(self, subtask: Subtask) -> bool:
        """A task alone in its region can get a new attempt now: it is wanted, nothing of it
        runs, and every partition it reads is available (a consumer whose input is being
        re-produced waits for it)."""
        return (
            subtask.wanted
            and subtask.winner is None
            and not subtask.live_attempts()
            and self.inputs_available(subtask)
            and not self.held(subtask.vertex)
            and not self.fused(subtask.vertex)
        )

    def held(self, name: str) -> bool:
        """Whether the vertex waits for a join's broadcast decision (broadcast_joins.py)."""
        join = self.broadcast_joins.join_held_by(name)
        if join is None:
            return False
        first_name = self.broadcast_joins.joins[join].first
        assert first_name is not None
        first = self.vertices[first_name]
        first_bytes = (
            sum(
                sum(s.winner.outcome.bytes_per_subpartition)
                for s in first.subtasks
                if s.winner and s.winner.outcome
            )
            if first.finished()
            else None
        )
        return self.broadcast_joins.holding(name, self.vertices[join].initialized, first_bytes)

    def broadcast_join(
        self, join: str, build: str, inputs: tuple[SubtaskInputs, ...]
    ) -> tuple[SubtaskInputs, ...]:
        """A broadcast decision for `join` (read `build` broadcast): its other side is fused into
        the join, or writes one unshuffled subpartition, if it has not started; the ranges
        returned read whole partitions of the other side, however they are made."""
        other = self.decide_broadcast(join, build)
        last = self.vertices[other].subpartitions - 1
        return tuple(
            SubtaskInputs(
                s.subtask,
                tuple(
                    dataclasses.replace(rng, subpartition_start=0, subpartition_end=last)
                    if rng.input == other
                    else rng
                    for rng in s.inputs
                ),
            )
            for s in inputs
        )

    def decide_broadcast(self, join: str, build: str) -> str:
        """What a broadcast decision for `join` changes outside the join's own ranges: `build`
        becomes its build side, and the other side (whose name is returned), if it has not
        started, is fused into the join or writes one unshuffled subpartition
        (`BroadcastJoins.decided`). Also what a driver taking the job over rebuilds from the
        decision (`recovery`), at the same point of the log."""
        other = next(i.producer for i in self.job.vertices[join].inputs if i.producer != build)
        producer = self.vertices[other]
        layout = other_side(
            started=any(s.attempts for s in producer.subtasks),
            consumers=len(self.consumers[other]),
            reads=bool(producer.definition.inputs),
        )
        self.broadcast_joins.decided(join, build, layout)
        producer.subpartitions = self._subpartitions_of(other)
        return other

    def bulk_ready(self, region: tuple[Task, ...]) -> tuple[Task, ...] | None:
        """The tasks of `region` to deploy together now, or None.

        Nothing while any task of the region runs (a restart cancels them first). Otherwise the
        wanted tasks, when what they read from outside the bulk is available: after a full
        restart that is the whole region behind its blocking inputs; a task redone alone (its
        region partners finished) reads their finished partitions like blocking ones.
        """
        subtasks = self.subtasks_of(region)
        if any(s.live_attempts() for s in subtasks):
            return None
        wanted = tuple(ExecutionVertexId(s.vertex, s.index) for s in subtasks if s.wanted)
        if not wanted:
            return None
        together = frozenset(wanted)
        if all(self.inputs_available(s, together) for s in subtasks if s.wanted):
            return wanted
        return None

    def subtasks_of(self, tasks: tuple[Task, ...]) -> list[Subtask]:
        found = [self.subtask(v, k) for v, k in tasks]
        assert all(s is not None for s in found), f"unknown task among {tasks}"
        return [s for s in found if s is not None]

    def all_done(self) -> bool:
        for vertex in self.vertices.values():
            if self.fused(vertex.name):
                continue  # ran inside its join, which must have finished
            if not vertex.finished():
                return False
            if vertex.definition.sink is not None and not all(s.committed for s in vertex.subtasks):
                return False
        return True

    def live_attempts(self) -> list[Attempt]:
        return [a for v in self.vertices.values() for s in v.subtasks for a in s.live_attempts()]

    def counts(self) -> tuple[int, int]:
        """(finished subtasks, known subtasks) for progress; a fused vertex's subtasks are its
        join's."""
        ran = [v for v in self.vertices.values() if not self.fused(v.name)]
        known = sum(len(v.subtasks) for v in ran)
        done = sum(1 for v in ran for s in v.subtasks if s.winner is not None)
        return done, known


def slot_requests(state: ExecutionState, queued: set[RequestKey]) -> list[SlotRequest]:
    """The slot requests to add to the pool: one per schedulable task alone in its region, one
    bulk per schedulable multi-task region (FLIP-119), none for what `queued` already holds
    (keys of pending requests)."""
    requests: list[SlotRequest] = []
    seen: set[Task] = set()
    for vertex in state.vertices.values():
        for subtask in vertex.subtasks:
            task = ExecutionVertexId(vertex.name, subtask.index)
            region = state.region_of(*task)
            if region is None:
                key: RequestKey = TaskRequest(task)
                if key not in queued and state.deployable(subtask):
                    requests.append(
                        SlotRequest(key=key, tasks=[task], not_before=subtask.not_before)
                    )
                continue
            if region[0] in seen:
                continue
            seen.add(region[0])
            key = region_key(region)
            if key in queued:
                continue
            bulk = state.bulk_ready(region)
            if bulk is not None:
                members = state.subtasks_of(bulk)
                requests.append(
                    SlotRequest(
                        key=key,
                        tasks=list(bulk),
                        not_before=max(s.not_before for s in members),
                    )
                )
    return requests


def region_key(region: tuple[Task, ...]) -> RegionRequest:
    """The pool key of a region's bulk request (named by its first task)."""
    return RegionRequest(region[0])
