"""ParallelismDecider: FLIP-187 adaptive parallelism and subpartition ranges, from events alone.

- `JobSubmitted`: sources without a fixed parallelism are decided at once, from their splits.
- `VertexInitialized`: a vertex's parallelism is known (whoever decided it).
- `AttemptFinished`: the first finished attempt of a subtask is its result. When every producer
  of an undecided vertex is initialised and has all its results, the vertex is decided. By
  default (`decider.algorithm = flink-2.1`) as Flink 2.1's
  `DefaultVertexParallelismAndInputInfosDecider` does it (`policy/flink.py`): greedy packing of
  slices under V gives the parallelism and the ranges, a fixed vertex not yet initialised gets
  byte-balanced ranges for its fixed parallelism. With `optimal` (tailguard 1.0):
  P = ceil(S / (V − min(Sb, ratio·V))), bounded, with optimally byte-balanced ranges.

Forward groups share one parallelism: the first member decided sets it, the others take it when
their own inputs are ready. A member that cannot take it (a POINTWISE or FORWARD producer has
fewer partitions, or its own bounds are lower) takes the largest parallelism it can and reads its
FORWARD inputs as contiguous partition ranges, so every partition is still read exactly once;
`forward_group_breaks` counts those.

One decision per vertex per job, id `derived_id("decider", job_id, vertex)`: a restarted service,
a replay and the agent's local fallback all emit the same id, and the agent applies it once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from tailguard.decider.policy.assign import InputInfo, data_bound, split_inputs, subtask_inputs
from tailguard.decider.policy.broadcast_join import (
    BroadcastJoinParams,
    Produced,
    decide_broadcast_join,
)
from tailguard.decider.policy.flink import compute_vertex_inputs, flink_data_bound
from tailguard.decider.policy.formula import (
    FLINK,
    DeciderParams,
    capped_broadcast_bytes,
    flink_parallelism,
    source_parallelism,
    unclamped_parallelism,
)
from tailguard.decider.policy.graph import GraphView
from tailguard.decider.policy.skew import SkewParams, applied_splits, plan_skew
from tailguard.model import records as r
from tailguard.model.config import ConfigError, Settings
from tailguard.model.ids import derived_id


@dataclass
class _Results:
    """What a vertex produced: the first result of each subtask, folded into byte sums so the
    state stays O(parallelism + subpartitions) per vertex."""

    parallelism: int
    partition_bytes: list[int]
    seen: list[bool]
    missing: int
    subpartition_bytes: list[int] = field(default_factory=lambda: [0])
    # Each subtask's bytes per subpartition, for POINTWISE slicing (references to the events'
    # tuples, so no copy).
    rows: list[tuple[int, ...]] = field(default_factory=list)

    @classmethod
    def empty(cls, parallelism: int) -> _Results:
        return cls(
            parallelism,
            [0] * parallelism,
            [False] * parallelism,
            parallelism,
            rows=[()] * parallelism,
        )

    def add(self, subtask: int, bytes_per_subpartition: tuple[int, ...]) -> bool:
        """Record a subtask's first result; True if this one completed the vertex."""
        if not 0 <= subtask < self.parallelism or self.seen[subtask]:
            return False
        sizes = [max(0, b) for b in bytes_per_subpartition]
        if len(sizes) > len(self.subpartition_bytes):
            self.subpartition_bytes.extend([0] * (len(sizes) - len(self.subpartition_bytes)))
        for i, b in enumerate(sizes):
            self.subpartition_bytes[i] += b
        self.seen[subtask] = True
        self.rows[subtask] = tuple(sizes)
        self.partition_bytes[subtask] = sum(sizes)
        self.missing -= 1
        return self.missing == 0


@dataclass
class _Job:
    params: DeciderParams
    graph: GraphView
    # The adaptive broadcast join's settings (`policy/broadcast_join.py`).
    broadcast: BroadcastJoinParams
    # Vertices the core will not decide (any more): fixed, initialised, or already decided.
    settled: set[str]
    results: dict[str, _Results] = field(default_factory=dict)
    group_parallelism: dict[str, int] = field(default_factory=dict)
    group_bound: dict[str, int] = field(default_factory=dict)
    # The skewed join splitting's settings (`policy/skew.py`).
    skew: SkewParams = field(default_factory=SkewParams)

    def bound(self, vertex: str) -> int:
        return self.params.upper_bound(self.graph.vertices[vertex].max_parallelism)

    def vertex_min(self, vertex: str) -> int:
        """The vertex's own min parallelism, when the job graph gives one (Flink 2.1's
        `vertexMinParallelism`); 1 otherwise."""
        own = self.graph.vertices[vertex].min_parallelism
        return own if own is not None and own > 0 else 1

    def complete(self, vertex: str) -> bool:
        produced = self.results.get(vertex)
        return produced is not None and produced.missing == 0


class ParallelismDecider:
    SERVICE: ClassVar[str] = "decider"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._jobs: dict[str, _Job] = {}
        self._counters: dict[str, int] = dict.fromkeys(
            (
                "decisions_emitted",
                "vertices_decided",
                "sources_decided",
                "forward_group_followers",
                "forward_group_breaks",
                "broadcast_capped",
                "sources_without_splits",
                "config_errors",
                "fixed_beyond_data",
                "broadcast_joins",
                "skewed_joins_split",
            ),
            0,
        )

    # ------------------------------------------------------------------ interface

    def handle(self, record: r.Record) -> list[r.Record]:
        if isinstance(record, r.JobSubmitted):
            return self._on_submitted(record)
        job = self._jobs.get(record.job_id)
        if job is None:
            return []
        if isinstance(record, r.VertexInitialized):
            return self._on_initialized(job, record)
        if isinstance(record, r.AttemptFinished):
            return self._on_finished(job, record)
        if isinstance(record, r.JobFinished):
            del self._jobs[record.job_id]
        return []

    def metrics(self) -> dict[str, float]:
        out = {name: float(value) for name, value in self._counters.items()}
        out["jobs_active"] = float(len(self._jobs))
        return out

    # ------------------------------------------------------------------ events

    def _on_submitted(self, event: r.JobSubmitted) -> list[r.Record]:
        if event.job_id in self._jobs:
            return []  # a repeated submission (redelivery) changes nothing
        try:
            job_settings = self.settings.for_job(event.config)
            params = DeciderParams.from_settings(job_settings)
            broadcast = BroadcastJoinParams.from_settings(job_settings)
            skew = SkewParams.from_settings(job_settings)
        except ConfigError:
            # A job's bad setting must not stop the service for every job: decide it with the
            # service's own settings (which are checked here too, and must be valid).
            self._counters["config_errors"] += 1
            params = DeciderParams.from_settings(self.settings)
            broadcast = BroadcastJoinParams.from_settings(self.settings)
            skew = SkewParams.from_settings(self.settings)
        graph = GraphView.of(event.graph)
        # Fixed vertices are the agent's to initialise, except those with blocking edges only:
        # they get byte-balanced ranges from the decider once their inputs have finished, and
        # the agent waits for them (`waits_for_decider`).
        fixed = {
            name
            for name, v in graph.vertices.items()
            if v.parallelism is not None
            and not waits_for_decider(
                [e.exchange for e in graph.inputs[name]],
                [e.exchange for e in event.graph.edges if e.source == name],
            )
        }
        job = _Job(params, graph, broadcast, settled=fixed, skew=skew)
        for leader, members in graph.members.items():
            bounds = [job.bound(m) for m in members]
            bounds += [
                len(graph.vertices[m].split_bytes) for m in members if _is_split_source(graph, m)
            ]
            job.group_bound[leader] = max(1, min(bounds))
            preset = [p for m in members if (p := graph.vertices[m].parallelism) is not None]
            if preset:
                job.group_parallelism[leader] = preset[0]
                if len(set(preset)) > 1:
                    # Fixed members that disagree: the user's graph cannot be uniform.
                    self._counters["forward_group_breaks"] += 1
        self._jobs[event.job_id] = job
        out: list[r.Record] = []
        for name in graph.order:
            if name in job.settled or graph.inputs[name]:
                continue
            decision = self._decide_source(job, event, name)
            if decision is not None:
                out.append(decision)
        return out

    def _on_initialized(self, job: _Job, event: r.VertexInitialized) -> list[r.Record]:
        name = event.vertex
        if name not in job.graph.vertices or name in job.results or event.parallelism < 1:
            return []
        job.settled.add(name)
        job.results[name] = _Results.empty(event.parallelism)
        job.group_parallelism.setdefault(job.graph.leader[name], event.parallelism)
        return self._decide_consumers(job, event, name)

    def _on_finished(self, job: _Job, event: r.AttemptFinished) -> list[r.Record]:
        produced = job.results.get(event.vertex)
        if produced is None or not produced.add(event.subtask, event.bytes_per_subpartition):
            return []
        return self._decide_consumers(job, event, event.vertex)

    # ------------------------------------------------------------------ decisions

    def _decide_consumers(self, job: _Job, cause: r.Event, producer: str) -> list[r.Record]:
        complete = job.complete(producer)
        out: list[r.Record] = []
        for consumer in job.graph.consumers[producer]:
            # A join may become a broadcast join once one side has finished (or, that side
            # being done, once the other is initialised), before the other side's bytes exist.
            decision = self._decide_broadcast_join(job, cause, consumer)
            if decision is None and complete:
                decision = self._decide_operator(job, cause, consumer)
            if decision is not None:
                out.append(decision)
        return out

    def _decide_broadcast_join(self, job: _Job, cause: r.Event, name: str) -> r.Record | None:
        if job.graph.vertices[name].join is None or name in job.settled:
            return None
        if job.graph.leader[name] in job.group_parallelism:
            return None  # its forward group's parallelism is set already
        produced = {
            e.source: Produced(
                p.parallelism,
                tuple(p.partition_bytes),
                len(p.subpartition_bytes),
                finished=p.missing == 0,
            )
            for e in job.graph.inputs[name]
            if (p := job.results.get(e.source)) is not None
        }
        decision = decide_broadcast_join(
            job.graph.vertices[name],
            job.graph.inputs[name],
            produced,
            job.bound(name),
            job.broadcast,
        )
        if decision is None:
            return None
        self._counters["broadcast_joins"] += 1
        inputs, why = decision
        out = self._emit(job, cause, name, len(inputs), inputs)
        return dataclasses.replace(out, broadcast=why)

    def _decide_source(self, job: _Job, cause: r.Event, name: str) -> r.Record | None:
        splits = job.graph.vertices[name].split_bytes
        if not splits:
            # No split to hand out: an InputRange cannot be empty. Left to the agent.
            self._counters["sources_without_splits"] += 1
            return None
        leader = job.graph.leader[name]
        hard = min(job.bound(name), len(splits))
        if leader in job.group_parallelism:
            parallelism = self._follow(job, leader, hard)
        else:
            total = sum(max(0, b) for b in splits)
            if job.params.algorithm == FLINK:
                # `computeSourceParallelismUpperBound`: min(default-source-parallelism, else
                # the global max, and the vertex's max). Below it the source infers its own
                # parallelism (FLIP-379's dynamic source inference): one subtask per V of
                # splits. min-parallelism does not apply to sources.
                upper = job.params.default_source_parallelism or job.params.max_parallelism
                wish = max(1, -(-total // job.params.volume_per_task))
                parallelism = max(1, min(hard, job.group_bound[leader], upper, wish))
            else:
                wish = source_parallelism(total, job.params)
                parallelism = min(hard, job.params.clamp(wish, job.group_bound[leader]))
            self._counters["sources_decided"] += 1
        return self._emit(job, cause, name, parallelism, split_inputs(parallelism, splits))

    def _inputs(self, job: _Job, name: str) -> list[InputInfo] | None:
        """What the vertex reads, once every producer has all its results; else None."""
        infos: list[InputInfo] = []
        for edge in job.graph.inputs[name]:
            if not job.complete(edge.source):
                return None
            produced = job.results[edge.source]
            nsub = len(produced.subpartition_bytes)
            infos.append(
                InputInfo(
                    producer=edge.source,
                    distribution=edge.distribution,
                    parallelism=produced.parallelism,
                    subpartitions=nsub,
                    partition_bytes=tuple(produced.partition_bytes),
                    subpartition_bytes=tuple(produced.subpartition_bytes),
                    bytes_by_partition=tuple(
                        row + (0,) * (nsub - len(row)) for row in produced.rows
                    ),
                )
            )
        return infos

    def _decide_operator(self, job: _Job, cause: r.Event, name: str) -> r.Record | None:
        if name in job.settled:
            return None
        infos = self._inputs(job, name)
        if infos is None:
            return None
        if job.params.algorithm == FLINK or job.graph.vertices[name].parallelism is not None:
            # A fixed vertex gets Flink 2.1's byte-balanced ranges at its parallelism under
            # either algorithm: the agent waits for them whichever decides adaptive vertices.
            return self._decide_flink(job, cause, name, infos)
        hard = job.bound(name)
        data = data_bound(infos)
        if data is not None:
            hard = min(hard, data)
        leader = job.graph.leader[name]
        if leader in job.group_parallelism:
            parallelism = self._follow(job, leader, hard)
        else:
            parallelism = min(hard, self._formula(job, infos, job.group_bound[leader]))
            self._counters["vertices_decided"] += 1
        return self._emit(job, cause, name, parallelism, subtask_inputs(parallelism, infos))

    def _decide_flink(
        self, job: _Job, cause: r.Event, name: str, infos: list[InputInfo]
    ) -> r.Record | None:
        """Flink 2.1's `decideParallelismAndInputInfosForVertex` for a non-source vertex."""
        params = job.params
        leader = job.graph.leader[name]
        fixed = job.graph.vertices[name].parallelism
        volume = self._volume(job, infos)
        # Skewed join splitting needs an adaptive parallelism, as in Flink.
        # A join's split slices; its two inputs' group takes the whole volume (a join that can
        # be split has no broadcast input).
        join = job.graph.vertices[name].join
        skew = None if fixed is not None else plan_skew(infos, join, job.skew, volume)
        data = flink_data_bound(infos) if skew is None else len(skew.positions)
        if fixed is not None:
            if data is not None and fixed > data:
                # The inputs cannot feed that many subtasks; the agent's static ranges report it.
                self._counters["fixed_beyond_data"] += 1
                job.settled.add(name)
                return None
            parallelism = low = high = fixed
        else:
            vertex_max = job.bound(name)
            low = max(params.min_parallelism, job.vertex_min(name))
            # A vertex max below the minimum lowers the minimum (Flink logs and does the same).
            low = min(low, vertex_max)
            high = min(vertex_max, job.group_bound[leader])
            if data is not None:
                high = min(high, data)
            low = max(1, min(low, high))
            if leader in job.group_parallelism:
                parallelism = self._follow(job, leader, high)
                low = high = parallelism
            else:
                self._counters["vertices_decided"] += 1
                parallelism = self._flink_parallelism(job, infos, low, high)
                if params.normalize_to_power_of_two:
                    low = high = parallelism  # the rounded P is the decision, not a first guess
        inputs = compute_vertex_inputs(infos, parallelism, low, high, volume, skew)
        splits = applied_splits(skew, inputs)
        if splits:
            self._counters["skewed_joins_split"] += 1
        return self._emit(job, cause, name, len(inputs), inputs, splits)

    def _flink_parallelism(self, job: _Job, infos: list[InputInfo], low: int, high: int) -> int:
        non_broadcast, broadcast = _split_bytes(infos)
        if capped_broadcast_bytes(broadcast, job.params) > 0:
            self._counters["broadcast_capped"] += 1
        parallelism, _ = flink_parallelism(non_broadcast, broadcast, low, high, job.params)
        return parallelism

    @staticmethod
    def _volume(job: _Job, infos: list[InputInfo]) -> int:
        _, broadcast = _split_bytes(infos)
        return flink_parallelism(0, broadcast, 1, 1, job.params)[1]

    def _formula(self, job: _Job, infos: list[InputInfo], upper: int) -> int:
        non_broadcast, broadcast = _split_bytes(infos)
        if capped_broadcast_bytes(broadcast, job.params) < broadcast:
            self._counters["broadcast_capped"] += 1
        return job.params.clamp(unclamped_parallelism(non_broadcast, broadcast, job.params), upper)

    def _follow(self, job: _Job, leader: str, hard: int) -> int:
        """A forward group's parallelism, as far as this member can take it."""
        group = job.group_parallelism[leader]
        self._counters["forward_group_followers"] += 1
        if hard < group:
            self._counters["forward_group_breaks"] += 1
        return max(1, min(group, hard))

    def _emit(
        self,
        job: _Job,
        cause: r.Event,
        name: str,
        parallelism: int,
        inputs: tuple[r.SubtaskInputs, ...],
        splits: tuple[r.SkewSplit, ...] = (),
    ) -> r.SetParallelism:
        job.settled.add(name)
        job.group_parallelism.setdefault(job.graph.leader[name], parallelism)
        self._counters["decisions_emitted"] += 1
        return r.SetParallelism(
            job_id=cause.job_id,
            ts=cause.ts,
            id=derived_id(self.SERVICE, cause.job_id, name),
            caused_by=(cause.id,),
            vertex=name,
            parallelism=parallelism,
            subtask_inputs=inputs,
            skew_splits=splits,
        )


def waits_for_decider(
    input_exchanges: Sequence[r.Exchange], output_exchanges: Sequence[r.Exchange]
) -> bool:
    """Whether a vertex with a fixed parallelism takes its ranges from the decider (once its
    inputs have finished) rather than the agent's count-based ones at once.

    As in Flink 2.1, a fixed vertex still gets byte-balanced ranges
    (`DefaultVertexParallelismAndInputInfosDecider` decides input infos for every vertex, at
    the fixed parallelism), under either `decider.algorithm`; they need its inputs' sizes. A
    source has no input to size; a vertex with a PIPELINED input is deployed with its
    producer, before any size exists, and one with a PIPELINED output belongs to a pipelined
    region, whose tasks are placed as one bulk (FLIP-119) from the parallelisms fixed at
    submission.
    """
    return bool(input_exchanges) and all(
        e is r.Exchange.BLOCKING for e in (*input_exchanges, *output_exchanges)
    )


def _split_bytes(infos: list[InputInfo]) -> tuple[int, int]:
    """(non-broadcast bytes, broadcast bytes) of a vertex's inputs."""
    non_broadcast = broadcast = 0
    for i in infos:
        assert i.partition_bytes is not None
        if i.distribution is r.Distribution.BROADCAST:
            broadcast += sum(i.partition_bytes)
        else:
            non_broadcast += sum(i.partition_bytes)
    return non_broadcast, broadcast


def _is_split_source(graph: GraphView, name: str) -> bool:
    return not graph.inputs[name] and bool(graph.vertices[name].split_bytes)
