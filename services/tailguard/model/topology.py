"""Job graph and execution topology: forward groups, pipelined regions, exchange modes.

`JobGraph` is the user's logical graph (FLIP-187's JobVertex level). `ExecutionTopology` expands
it into execution vertices `(vertex, subtask)` once parallelisms are known and computes the
pipelined regions of FLIP-119: the connected components over PIPELINED execution edges. A region
is the unit of scheduling (FLIP-119) and of failover (FLIP-1).

ALL_TO_ALL and BROADCAST connectivity is kept at the vertex level ("every producer subtask feeds
every consumer subtask") instead of as p*c execution edges, so a 100,000-subtask graph whose
edges are all blocking costs linear time and memory.

Pure: standard library and `tailguard.model` only.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from tailguard.model.records import (
    Distribution,
    EdgeSpec,
    Exchange,
    JobGraphSpec,
    SubtaskInputs,
    TaskRef,
    VertexSpec,
)


class GraphError(ValueError):
    """A job graph that is not a DAG over its declared vertices."""


# --------------------------------------------------------------------------- job graph


class JobGraph:
    """The logical job graph with lookups by vertex name.

    Topological order is stable: among vertices whose producers are all placed, the one
    declared first in the spec comes first, so the order never depends on hashing.
    """

    def __init__(self, spec: JobGraphSpec) -> None:
        self.spec = spec
        self.vertices: dict[str, VertexSpec] = {}
        for vertex in spec.vertices:
            if vertex.name in self.vertices:
                raise GraphError(f"duplicate vertex {vertex.name!r}")
            self.vertices[vertex.name] = vertex
        self._inputs: dict[str, list[EdgeSpec]] = {name: [] for name in self.vertices}
        self._outputs: dict[str, list[EdgeSpec]] = {name: [] for name in self.vertices}
        for edge in spec.edges:
            for end in (edge.source, edge.target):
                if end not in self.vertices:
                    raise GraphError(f"edge {edge.source}->{edge.target}: unknown vertex {end!r}")
            self._inputs[edge.target].append(edge)
            self._outputs[edge.source].append(edge)
        for edges in self._inputs.values():
            edges.sort(key=lambda e: e.index)
        self.order: tuple[str, ...] = self._topological_order()
        self._position = {name: k for k, name in enumerate(self.order)}

    def _topological_order(self) -> tuple[str, ...]:
        declared = {name: k for k, name in enumerate(self.vertices)}
        missing = {name: len(self._inputs[name]) for name in self.vertices}
        ready = sorted((n for n, k in missing.items() if k == 0), key=declared.__getitem__)
        order: list[str] = []
        while ready:
            name = ready.pop(0)
            order.append(name)
            for edge in self._outputs[name]:
                missing[edge.target] -= 1
                if missing[edge.target] == 0:
                    ready.append(edge.target)
                    ready.sort(key=declared.__getitem__)
        if len(order) != len(self.vertices):
            cyclic = sorted(n for n, k in missing.items() if k > 0)
            raise GraphError(f"job graph has a cycle through {cyclic}")
        return tuple(order)

    def position(self, vertex: str) -> int:
        """The vertex's index in the topological order."""
        return self._position[vertex]

    def inputs(self, vertex: str) -> tuple[EdgeSpec, ...]:
        """The vertex's input edges, by input index."""
        return tuple(self._inputs[vertex])

    def outputs(self, vertex: str) -> tuple[EdgeSpec, ...]:
        return tuple(self._outputs[vertex])

    def producers(self, vertex: str) -> tuple[str, ...]:
        return _unique(e.source for e in self._inputs[vertex])

    def consumers(self, vertex: str) -> tuple[str, ...]:
        return _unique(
            e.target for e in sorted(self._outputs[vertex], key=lambda e: self.position(e.target))
        )

    def forward_groups(self) -> tuple[tuple[str, ...], ...]:
        """Vertices joined by FORWARD edges (transitively), which must share one parallelism.

        Every vertex is in exactly one group (a vertex without forward edges is alone). Groups
        are listed in the topological order of their first member, members in topological order.
        """
        parent = {name: name for name in self.order}

        def find(name: str) -> str:
            while parent[name] != name:
                parent[name] = parent[parent[name]]
                name = parent[name]
            return name

        for edge in self.spec.edges:
            if edge.distribution is Distribution.FORWARD:
                a, b = find(edge.source), find(edge.target)
                if a != b:
                    # The earlier vertex stays the root, so group identity follows topology.
                    first, second = sorted((a, b), key=self.position)
                    parent[second] = first
        groups: dict[str, list[str]] = {}
        for name in self.order:
            groups.setdefault(find(name), []).append(name)
        return tuple(tuple(members) for members in groups.values())

    def forward_group_of(self, vertex: str) -> tuple[str, ...]:
        for group in self.forward_groups():
            if vertex in group:
                return group
        raise KeyError(vertex)


def _unique(names: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(names))


# --------------------------------------------------------------------------- exchange modes


class DataExchangeMode(enum.Enum):
    """FLIP-119's GlobalDataExchangeMode: which job edges become PIPELINED."""

    ALL_EDGES_BLOCKING = "all-blocking"
    FORWARD_EDGES_PIPELINED = "forward-pipelined-only"
    POINTWISE_EDGES_PIPELINED = "pointwise-pipelined-only"
    ALL_EDGES_PIPELINED = "all-pipelined"

    @classmethod
    def parse(cls, text: str) -> DataExchangeMode:
        """A `table.exec.shuffle-mode` value, including FLIP-119's legacy 'pipelined' and
        'batch'."""
        value = _LEGACY_SHUFFLE_MODES.get(text.strip().lower(), text.strip().lower())
        for mode in cls:
            if mode.value == value or mode.name.lower() == value:
                return mode
        raise ValueError(f"unknown data exchange mode {text!r}")

    def exchange_for(self, distribution: Distribution) -> Exchange:
        if self is DataExchangeMode.ALL_EDGES_PIPELINED:
            return Exchange.PIPELINED
        if self is DataExchangeMode.FORWARD_EDGES_PIPELINED:
            pipelined = distribution is Distribution.FORWARD
        elif self is DataExchangeMode.POINTWISE_EDGES_PIPELINED:
            # FLIP-119: "pointwise distribution pattern includes FORWARD and RESCALE"; a
            # broadcast is all-to-all in Flink's terms, so it stays blocking.
            pipelined = distribution in (Distribution.FORWARD, Distribution.POINTWISE)
        else:
            pipelined = False
        return Exchange.PIPELINED if pipelined else Exchange.BLOCKING


_LEGACY_SHUFFLE_MODES = {"pipelined": "all-pipelined", "batch": "all-blocking"}


def with_exchange_mode(spec: JobGraphSpec, mode: DataExchangeMode) -> JobGraphSpec:
    """The graph with every edge's exchange assigned by `mode`."""
    edges = tuple(replace(e, exchange=mode.exchange_for(e.distribution)) for e in spec.edges)
    return replace(spec, edges=edges)


# --------------------------------------------------------------------------- execution level

# A consumer subtask's producer subtasks on one edge: inclusive (start, end) ranges.
_Ranges = tuple[tuple[int, int], ...]


def pointwise_producers(producers: int, consumers: int, subtask: int) -> tuple[int, int]:
    """Flink's POINTWISE rule (EdgeManagerBuildUtil.connectPointwise): the inclusive range of
    producer subtasks that consumer `subtask` reads when no explicit ranges are given."""
    if producers >= consumers:
        return (subtask * producers // consumers, (subtask + 1) * producers // consumers - 1)
    # Fewer producers: each producer feeds a contiguous block of consumers; find our producer.
    for p in range(producers):
        start = (p * consumers + producers - 1) // producers
        end = ((p + 1) * consumers + producers - 1) // producers
        if start <= subtask < end:
            return (p, p)
    raise ValueError(f"subtask {subtask} out of range for {consumers} consumers")


@dataclass(frozen=True, slots=True)
class _ExecutionEdge:
    spec: EdgeSpec
    producers: int
    consumers: int
    # None: every producer subtask feeds every consumer subtask (kept at the vertex level).
    ranges: tuple[_Ranges, ...] | None

    @property
    def pipelined(self) -> bool:
        return self.spec.exchange is Exchange.PIPELINED

    def producers_of(self, subtask: int) -> Iterable[int]:
        if self.ranges is None:
            return range(self.producers)
        return _expand(self.ranges[subtask])


def _expand(ranges: _Ranges) -> list[int]:
    seen: dict[int, None] = {}
    for start, end in ranges:
        for p in range(start, end + 1):
            seen[p] = None
    return sorted(seen)


@dataclass(frozen=True, slots=True)
class PipelinedRegion:
    """Execution vertices connected by pipelined exchanges: scheduled and restarted as a unit."""

    index: int
    tasks: tuple[TaskRef, ...]

    def slot_demand(self) -> int:
        """Slots the region needs at once when all its tasks share slots (FLIP-119): a slot can
        hold one subtask of each vertex, so the demand is the largest per-vertex task count."""
        counts: dict[str, int] = {}
        for task in self.tasks:
            counts[task.vertex] = counts.get(task.vertex, 0) + 1
        return max(counts.values(), default=0)


class ExecutionTopology:
    """Execution vertices of the vertices whose parallelism is known, and their regions.

    Vertices missing from `parallelisms` (not initialised yet, FLIP-187) are left out, as are
    edges touching them. `subtask_inputs[v]` (from `VertexInitialized`/`SetParallelism`) gives a
    consumer subtask's producer subtasks exactly; without it FORWARD and POINTWISE edges follow
    Flink's pointwise rule and ALL_TO_ALL/BROADCAST edges connect everything.
    """

    def __init__(
        self,
        graph: JobGraph,
        parallelisms: Mapping[str, int],
        subtask_inputs: Mapping[str, Sequence[SubtaskInputs]] | None = None,
    ) -> None:
        self.graph = graph
        self.vertices: tuple[str, ...] = tuple(v for v in graph.order if parallelisms.get(v, 0) > 0)
        self.parallelism: dict[str, int] = {v: parallelisms[v] for v in self.vertices}
        self._offset: dict[str, int] = {}
        total = 0
        for v in self.vertices:
            self._offset[v] = total
            total += self.parallelism[v]
        self.size = total
        inputs = subtask_inputs or {}
        self._in_edges: dict[str, list[_ExecutionEdge]] = {v: [] for v in self.vertices}
        self._out_edges: dict[str, list[_ExecutionEdge]] = {v: [] for v in self.vertices}
        for v in self.vertices:
            for spec in graph.inputs(v):
                if spec.source not in self.parallelism:
                    continue
                edge = self._make_edge(spec, inputs.get(v))
                self._in_edges[v].append(edge)
                self._out_edges[spec.source].append(edge)
        self._region_of: list[int] = self._compute_regions()
        self.region_count = max(self._region_of, default=-1) + 1
        self._regions: tuple[PipelinedRegion, ...] | None = None
        self._vertex_regions: dict[str, frozenset[int]] = {}
        self._reverse: dict[int, list[list[int]]] = {}

    # ------------------------------------------------------------ construction

    def _make_edge(
        self, spec: EdgeSpec, declared: Sequence[SubtaskInputs] | None
    ) -> _ExecutionEdge:
        p, c = self.parallelism[spec.source], self.parallelism[spec.target]
        ranges = _declared_ranges(spec.source, p, c, declared)
        if ranges is None:
            if spec.distribution in (Distribution.ALL_TO_ALL, Distribution.BROADCAST):
                return _ExecutionEdge(spec, p, c, None)
            if spec.distribution is Distribution.FORWARD and p == c:
                ranges = tuple(((k, k),) for k in range(c))
            else:
                # A FORWARD edge between unequal parallelisms degrades to POINTWISE, as Flink's
                # adaptive scheduler does when it cannot keep a forward group together.
                ranges = tuple((pointwise_producers(p, c, k),) for k in range(c))
        if all(r == ((0, p - 1),) for r in ranges):
            return _ExecutionEdge(spec, p, c, None)
        return _ExecutionEdge(spec, p, c, ranges)

    def _compute_regions(self) -> list[int]:
        parent = list(range(self.size))

        def find(x: int) -> int:
            root = x
            while parent[root] != root:
                root = parent[root]
            while parent[x] != root:
                parent[x], x = root, parent[x]
            return root

        def union(a: int, b: int) -> None:
            ra, rb = find(a), find(b)
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)

        any_pipelined = False
        for v in self.vertices:
            for edge in self._in_edges[v]:
                if not edge.pipelined:
                    continue
                any_pipelined = True
                p0, c0 = self._offset[edge.spec.source], self._offset[v]
                if edge.ranges is None:
                    for j in range(edge.producers):
                        union(p0, p0 + j)
                    for k in range(edge.consumers):
                        union(p0, c0 + k)
                else:
                    for k, ranges in enumerate(edge.ranges):
                        for start, end in ranges:
                            for j in range(start, end + 1):
                                union(c0 + k, p0 + j)
        region = _renumber([find(x) for x in range(self.size)])
        if any_pipelined:
            # Blocking edges between regions can close a cycle ({A,C} -> {B} -> {A,C} when
            # A->C is pipelined and A->B->C blocking); such regions could never be scheduled one
            # after the other, so they are merged, as Flink does.
            region = self._merge_cycles(region)
        return region

    def _merge_cycles(self, region: list[int]) -> list[int]:
        count = max(region, default=-1) + 1
        succ: list[set[int]] = [set() for _ in range(count)]
        for v in self.vertices:
            for edge in self._in_edges[v]:
                if edge.pipelined:
                    continue
                p0, c0 = self._offset[edge.spec.source], self._offset[v]
                if edge.ranges is None:
                    # A hub node keeps all-to-all reachability linear in size.
                    hub = len(succ)
                    succ.append({region[c0 + k] for k in range(edge.consumers)})
                    for j in range(edge.producers):
                        succ[region[p0 + j]].add(hub)
                else:
                    for k, ranges in enumerate(edge.ranges):
                        for start, end in ranges:
                            for j in range(start, end + 1):
                                if region[p0 + j] != region[c0 + k]:
                                    succ[region[p0 + j]].add(region[c0 + k])
        component = _strongly_connected(succ)
        if len(set(component[:count])) == count:
            return region
        return _renumber([component[r] for r in region])

    # ------------------------------------------------------------ execution vertices

    def tasks(self) -> Iterable[TaskRef]:
        for v in self.vertices:
            for k in range(self.parallelism[v]):
                yield TaskRef(v, k)

    def contains(self, vertex: str, subtask: int) -> bool:
        return 0 <= subtask < self.parallelism.get(vertex, 0)

    def input_producers(self, vertex: str, subtask: int) -> list[tuple[EdgeSpec, list[int]]]:
        """Per input edge of the execution vertex: the producer subtasks it reads."""
        return [(e.spec, list(e.producers_of(subtask))) for e in self._in_edges[vertex]]

    def output_consumers(self, vertex: str, subtask: int) -> list[tuple[EdgeSpec, list[int]]]:
        """Per output edge of the execution vertex: the consumer subtasks that read it."""
        out: list[tuple[EdgeSpec, list[int]]] = []
        for e in self._out_edges[vertex]:
            if e.ranges is None:
                out.append((e.spec, list(range(e.consumers))))
            else:
                out.append((e.spec, self._reverse_of(e)[subtask]))
        return out

    def producers_of(self, vertex: str, subtask: int) -> tuple[TaskRef, ...]:
        return _unique_tasks(
            TaskRef(spec.source, j)
            for spec, subtasks in self.input_producers(vertex, subtask)
            for j in subtasks
        )

    def consumers_of(self, vertex: str, subtask: int) -> tuple[TaskRef, ...]:
        return _unique_tasks(
            TaskRef(spec.target, k)
            for spec, subtasks in self.output_consumers(vertex, subtask)
            for k in subtasks
        )

    def consumed_among(
        self, vertex: str, subtask: int, candidates: Mapping[str, Iterable[int]]
    ) -> tuple[TaskRef, ...]:
        """Which of the candidate producer subtasks (by vertex) the execution vertex reads.

        Costs O(candidates) per input edge, not O(producer parallelism): the way to ask about a
        few partitions of a wide all-to-all input."""
        found: list[TaskRef] = []
        for edge in self._in_edges[vertex]:
            chosen = candidates.get(edge.spec.source)
            if not chosen:
                continue
            if edge.ranges is None:
                found.extend(TaskRef(edge.spec.source, j) for j in chosen)
            else:
                ranges = edge.ranges[subtask]
                found.extend(
                    TaskRef(edge.spec.source, j)
                    for j in chosen
                    if any(start <= j <= end for start, end in ranges)
                )
        return _unique_tasks(found)

    def _reverse_of(self, edge: _ExecutionEdge) -> list[list[int]]:
        cached = self._reverse.get(id(edge))
        if cached is None:
            cached = [[] for _ in range(edge.producers)]
            assert edge.ranges is not None
            for k in range(edge.consumers):
                for j in edge.producers_of(k):
                    cached[j].append(k)
            self._reverse[id(edge)] = cached
        return cached

    # ------------------------------------------------------------ regions

    def region_index(self, vertex: str, subtask: int) -> int:
        if not self.contains(vertex, subtask):
            raise KeyError(f"no execution vertex {vertex}[{subtask}]")
        return self._region_of[self._offset[vertex] + subtask]

    def region_of(self, vertex: str, subtask: int) -> PipelinedRegion:
        return self.regions()[self.region_index(vertex, subtask)]

    def regions(self) -> tuple[PipelinedRegion, ...]:
        """All regions, numbered in the topological order of their first task."""
        if self._regions is None:
            members: list[list[TaskRef]] = [[] for _ in range(self.region_count)]
            for v in self.vertices:
                base = self._offset[v]
                for k in range(self.parallelism[v]):
                    members[self._region_of[base + k]].append(TaskRef(v, k))
            self._regions = tuple(PipelinedRegion(i, tuple(m)) for i, m in enumerate(members))
        return self._regions

    def _regions_of_vertex(self, vertex: str) -> frozenset[int]:
        cached = self._vertex_regions.get(vertex)
        if cached is None:
            base = self._offset[vertex]
            cached = frozenset(self._region_of[base : base + self.parallelism[vertex]])
            self._vertex_regions[vertex] = cached
        return cached

    def region_input_tasks(self, index: int) -> tuple[TaskRef, ...]:
        """The producer execution vertices outside the region whose partitions it consumes."""
        found: dict[TaskRef, None] = {}
        done_full: set[int] = set()
        for task in self.regions()[index].tasks:
            for edge in self._in_edges[task.vertex]:
                if edge.ranges is None:
                    if id(edge) in done_full:
                        continue
                    done_full.add(id(edge))
                subtasks = edge.producers_of(task.subtask)
                base = self._offset[edge.spec.source]
                for j in subtasks:
                    if self._region_of[base + j] != index:
                        found[TaskRef(edge.spec.source, j)] = None
        return tuple(found)

    def region_producers(self, index: int) -> tuple[int, ...]:
        """Regions whose (blocking) partitions the region consumes."""
        found: set[int] = set()
        for task in self.regions()[index].tasks:
            for edge in self._in_edges[task.vertex]:
                if edge.ranges is None:
                    found |= self._regions_of_vertex(edge.spec.source)
                else:
                    base = self._offset[edge.spec.source]
                    found.update(self._region_of[base + j] for j in edge.producers_of(task.subtask))
        found.discard(index)
        return tuple(sorted(found))

    def region_consumers(self, index: int) -> tuple[int, ...]:
        """Regions that consume (blocking) partitions of the region."""
        found: set[int] = set()
        for task in self.regions()[index].tasks:
            for edge in self._out_edges[task.vertex]:
                if edge.ranges is None:
                    found |= self._regions_of_vertex(edge.spec.target)
                else:
                    base = self._offset[edge.spec.target]
                    consumers = self._reverse_of(edge)[task.subtask]
                    found.update(self._region_of[base + k] for k in consumers)
        found.discard(index)
        return tuple(sorted(found))


def _declared_ranges(
    producer: str, p: int, c: int, declared: Sequence[SubtaskInputs] | None
) -> tuple[_Ranges, ...] | None:
    """Per consumer subtask, the producer ranges declared for input `producer`, clamped to the
    producer's parallelism; None unless every consumer subtask declares one."""
    if not declared:
        return None
    by_subtask: dict[int, list[tuple[int, int]]] = {}
    for entry in declared:
        for r in entry.inputs:
            if r.input == producer:
                start, end = max(r.partition_start, 0), min(r.partition_end, p - 1)
                if start <= end:
                    by_subtask.setdefault(entry.subtask, []).append((start, end))
    if any(k not in by_subtask for k in range(c)):
        return None
    return tuple(tuple(by_subtask[k]) for k in range(c))


def _unique_tasks(tasks: Iterable[TaskRef]) -> tuple[TaskRef, ...]:
    return tuple(dict.fromkeys(tasks))


def _renumber(labels: list[int]) -> list[int]:
    """Relabel to 0, 1, ... in order of first appearance."""
    mapping: dict[int, int] = {}
    return [mapping.setdefault(label, len(mapping)) for label in labels]


def _strongly_connected(succ: list[set[int]]) -> list[int]:
    """Tarjan's algorithm, iterative: a component label per node."""
    n = len(succ)
    index = [-1] * n
    low = [0] * n
    on_stack = [False] * n
    label = [-1] * n
    stack: list[int] = []
    counter = 0
    components = 0
    for root in range(n):
        if index[root] != -1:
            continue
        work: list[tuple[int, list[int]]] = [(root, sorted(succ[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack[root] = True
        while work:
            node, pending = work[-1]
            if pending:
                nxt = pending.pop()
                if index[nxt] == -1:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack[nxt] = True
                    work.append((nxt, sorted(succ[nxt])))
                elif on_stack[nxt]:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                while True:
                    member = stack.pop()
                    on_stack[member] = False
                    label[member] = components
                    if member == node:
                        break
                components += 1
    return label


# --------------------------------------------------------------------------- slots


def minimum_slots(
    graph: JobGraph | JobGraphSpec,
    parallelisms: Mapping[str, int],
    mode: DataExchangeMode | None = None,
) -> int:
    """The slots a job needs to run at all (FLIP-119): the largest pipelined region's demand,
    all tasks in one slot sharing group. `mode` reassigns every edge's exchange first; None
    keeps the exchanges the graph declares."""
    spec = graph.spec if isinstance(graph, JobGraph) else graph
    if mode is not None:
        spec = with_exchange_mode(spec, mode)
    topology = ExecutionTopology(JobGraph(spec), parallelisms)
    return max((r.slot_demand() for r in topology.regions()), default=0)
