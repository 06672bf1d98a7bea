"""The decider's view of a submitted job graph: topological order, inputs, forward groups.

Built once per job from `JobSubmitted` (the shared topology model is not needed for this much).
Everything is ordered by topological position with names breaking ties, so decisions come out
in the same order on every run.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from tailguard.model.records import Distribution, EdgeSpec, JobGraphSpec, VertexSpec


@dataclass(frozen=True, slots=True)
class GraphView:
    order: tuple[str, ...]
    vertices: dict[str, VertexSpec]
    # A vertex's input edges, in input order (EdgeSpec.index, then producer name).
    inputs: dict[str, tuple[EdgeSpec, ...]]
    # A vertex's consumers, each once, in topological order.
    consumers: dict[str, tuple[str, ...]]
    # Forward groups (FLIP-187): vertices joined by FORWARD edges share one parallelism. Each
    # vertex maps to its group's leader, the member that comes first in topological order.
    leader: dict[str, str]
    members: dict[str, tuple[str, ...]]

    @classmethod
    def of(cls, graph: JobGraphSpec) -> GraphView:
        vertices: dict[str, VertexSpec] = {}
        for v in graph.vertices:
            vertices.setdefault(v.name, v)  # a repeated name is malformed; the first one counts
        edges = sorted(
            (e for e in graph.edges if e.source in vertices and e.target in vertices),
            key=lambda e: (e.target, e.index, e.source, e.distribution.value),
        )
        order = _topological_order(vertices, edges)
        position = {name: i for i, name in enumerate(order)}
        inputs: dict[str, list[EdgeSpec]] = {name: [] for name in vertices}
        consumers: dict[str, set[str]] = {name: set() for name in vertices}
        for e in edges:
            inputs[e.target].append(e)
            consumers[e.source].add(e.target)
        leader = _forward_groups(order, edges)
        members: dict[str, list[str]] = {}
        for name in order:
            members.setdefault(leader[name], []).append(name)
        return cls(
            order=order,
            vertices=vertices,
            inputs={name: tuple(es) for name, es in inputs.items()},
            consumers={
                name: tuple(sorted(cs, key=position.__getitem__)) for name, cs in consumers.items()
            },
            leader=leader,
            members={name: tuple(ms) for name, ms in members.items()},
        )


def _topological_order(vertices: dict[str, VertexSpec], edges: list[EdgeSpec]) -> tuple[str, ...]:
    """Kahn's algorithm, smallest name first among the ready ones; vertices on a cycle (a
    malformed graph) come last, by name, and simply never become ready."""
    indegree = dict.fromkeys(vertices, 0)
    targets: dict[str, list[str]] = {name: [] for name in vertices}
    for e in edges:
        indegree[e.target] += 1
        targets[e.source].append(e.target)
    ready = [name for name, d in indegree.items() if d == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        name = heapq.heappop(ready)
        order.append(name)
        for t in targets[name]:
            indegree[t] -= 1
            if indegree[t] == 0:
                heapq.heappush(ready, t)
    placed = set(order)
    order.extend(sorted(name for name in vertices if name not in placed))
    return tuple(order)


def _forward_groups(order: tuple[str, ...], edges: list[EdgeSpec]) -> dict[str, str]:
    position = {name: i for i, name in enumerate(order)}
    parent = {name: name for name in order}

    def find(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    for e in edges:
        if e.distribution is Distribution.FORWARD:
            a, b = find(e.source), find(e.target)
            if a != b:
                # The root is always the earliest member, so it is the group's leader.
                first, second = (a, b) if position[a] < position[b] else (b, a)
                parent[second] = first
    return {name: find(name) for name in order}
