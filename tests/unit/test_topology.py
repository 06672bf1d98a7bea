"""Job graph, execution topology and pipelined regions (FLIP-119)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.examples_budget import examples

from tailguard.model.records import (
    Distribution,
    EdgeSpec,
    Exchange,
    InputRange,
    JobGraphSpec,
    SubtaskInputs,
    TaskRef,
    VertexKind,
    VertexSpec,
)
from tailguard.model.topology import (
    DataExchangeMode,
    ExecutionTopology,
    GraphError,
    JobGraph,
    minimum_slots,
    pointwise_producers,
    with_exchange_mode,
)

FWD, PW, A2A, BC = (
    Distribution.FORWARD,
    Distribution.POINTWISE,
    Distribution.ALL_TO_ALL,
    Distribution.BROADCAST,
)
BLOCKING, PIPELINED = Exchange.BLOCKING, Exchange.PIPELINED


def vertex(name: str) -> VertexSpec:
    return VertexSpec(name, VertexKind.OPERATOR)


def graph(vertices: str, *edges: tuple[str, str, Distribution, Exchange]) -> JobGraphSpec:
    return JobGraphSpec(
        tuple(vertex(v) for v in vertices),
        tuple(EdgeSpec(s, t, d, x) for s, t, d, x in edges),
    )


def names(tasks: tuple[TaskRef, ...]) -> set[str]:
    """Flink's notation: subtask k of vertex A is A(k+1)."""
    return {f"{t.vertex}{t.subtask + 1}" for t in tasks}


# --------------------------------------------------------------------------- FLIP-119 example

# The job of FLIP-119's "Data Exchange Mode Examples": A(2) -forward-> B(2) -rescale-> C(4)
# -hash-> D(4); three logical edges.
FLIP119_JOB = graph(
    "ABCD",
    ("A", "B", FWD, BLOCKING),
    ("B", "C", PW, BLOCKING),
    ("C", "D", A2A, BLOCKING),
)
FLIP119_PARALLELISM = {"A": 2, "B": 2, "C": 4, "D": 4}


@pytest.mark.parametrize(
    ("mode", "regions", "blocking_edges", "slots"),
    [
        (
            DataExchangeMode.ALL_EDGES_BLOCKING,
            [{"A1"}, {"A2"}, {"B1"}, {"B2"}]
            + [{f"C{k}"} for k in range(1, 5)]
            + [{f"D{k}"} for k in range(1, 5)],
            3,
            1,
        ),
        (
            # The seed lists "{A1, B1}, {A1, B2}": the second is a typo for {A2, B2}, since
            # forward edges connect A_k with B_k only.
            DataExchangeMode.FORWARD_EDGES_PIPELINED,
            [{"A1", "B1"}, {"A2", "B2"}]
            + [{f"C{k}"} for k in range(1, 5)]
            + [{f"D{k}"} for k in range(1, 5)],
            2,
            1,
        ),
        (
            DataExchangeMode.POINTWISE_EDGES_PIPELINED,
            [{"A1", "B1", "C1", "C2"}, {"A2", "B2", "C3", "C4"}] + [{f"D{k}"} for k in range(1, 5)],
            1,
            2,
        ),
        (
            # The seed's listing says "A2, B2, B3", a typo: B has two subtasks.
            DataExchangeMode.ALL_EDGES_PIPELINED,
            [{"A1", "A2", "B1", "B2", "C1", "C2", "C3", "C4", "D1", "D2", "D3", "D4"}],
            0,
            4,
        ),
    ],
)
def test_flip119_exchange_mode_examples(
    mode: DataExchangeMode, regions: list[set[str]], blocking_edges: int, slots: int
) -> None:
    spec = with_exchange_mode(FLIP119_JOB, mode)
    topology = ExecutionTopology(JobGraph(spec), FLIP119_PARALLELISM)

    assert sorted(names(r.tasks) for r in topology.regions()) == sorted(regions, key=sorted)
    assert sum(1 for e in spec.edges if e.exchange is BLOCKING) == blocking_edges
    assert minimum_slots(FLIP119_JOB, FLIP119_PARALLELISM, mode) == slots


def test_seed_figures_in_region_and_slot_counts() -> None:
    counts = [
        (
            ExecutionTopology(
                JobGraph(with_exchange_mode(FLIP119_JOB, mode)), FLIP119_PARALLELISM
            ).region_count,
            minimum_slots(FLIP119_JOB, FLIP119_PARALLELISM, mode),
        )
        for mode in DataExchangeMode
    ]
    assert counts == [(12, 1), (10, 1), (6, 2), (1, 4)]


def test_minimum_slots_keeps_declared_exchanges_without_a_mode() -> None:
    spec = graph("AB", ("A", "B", A2A, PIPELINED))
    assert minimum_slots(spec, {"A": 3, "B": 5}) == 5
    assert minimum_slots(JobGraph(spec), {"A": 3, "B": 5}, DataExchangeMode.ALL_EDGES_BLOCKING) == 1


def test_exchange_modes_parse_flip119_names_and_legacy_values() -> None:
    assert DataExchangeMode.parse("pointwise-pipelined-only") is (
        DataExchangeMode.POINTWISE_EDGES_PIPELINED
    )
    assert DataExchangeMode.parse("ALL_EDGES_BLOCKING") is DataExchangeMode.ALL_EDGES_BLOCKING
    assert DataExchangeMode.parse("pipelined") is DataExchangeMode.ALL_EDGES_PIPELINED
    assert DataExchangeMode.parse("batch") is DataExchangeMode.ALL_EDGES_BLOCKING
    with pytest.raises(ValueError, match="unknown"):
        DataExchangeMode.parse("sometimes")


def test_broadcast_stays_blocking_in_pointwise_mode() -> None:
    spec = with_exchange_mode(
        graph("ABC", ("A", "B", BC, PIPELINED), ("A", "C", PW, BLOCKING)),
        DataExchangeMode.POINTWISE_EDGES_PIPELINED,
    )
    assert [e.exchange for e in spec.edges] == [BLOCKING, PIPELINED]


# --------------------------------------------------------------------------- job graph


def test_topological_order_is_stable_and_follows_declaration() -> None:
    spec = graph(
        "DCBA",
        ("A", "B", A2A, BLOCKING),
        ("C", "B", A2A, BLOCKING),
        ("B", "D", FWD, BLOCKING),
    )
    g = JobGraph(spec)
    assert g.order == ("C", "A", "B", "D")
    assert g.producers("B") == ("A", "C")
    assert g.consumers("A") == ("B",)
    assert g.producers("C") == ()


def test_inputs_are_ordered_by_index() -> None:
    spec = JobGraphSpec(
        (vertex("L"), vertex("R"), vertex("J")),
        (EdgeSpec("R", "J", A2A, index=1), EdgeSpec("L", "J", A2A, index=0)),
    )
    assert [e.source for e in JobGraph(spec).inputs("J")] == ["L", "R"]


def test_cycles_and_unknown_vertices_are_rejected() -> None:
    with pytest.raises(GraphError, match="cycle"):
        JobGraph(graph("AB", ("A", "B", A2A, BLOCKING), ("B", "A", A2A, BLOCKING)))
    with pytest.raises(GraphError, match="unknown vertex"):
        JobGraph(graph("A", ("A", "Z", A2A, BLOCKING)))
    with pytest.raises(GraphError, match="duplicate"):
        JobGraph(JobGraphSpec((vertex("A"), vertex("A")), ()))


def test_forward_groups_join_vertices_transitively() -> None:
    spec = graph(
        "ABCDEF",
        ("A", "B", FWD, BLOCKING),
        ("B", "C", A2A, BLOCKING),
        ("C", "D", FWD, BLOCKING),
        ("E", "D", FWD, BLOCKING),
        ("D", "F", PW, BLOCKING),
    )
    g = JobGraph(spec)
    # Topological order is A, B, C, E, D, F; groups and members follow it.
    assert g.forward_groups() == (("A", "B"), ("C", "E", "D"), ("F",))
    assert set(g.forward_group_of("E")) == {"C", "D", "E"}
    for group in g.forward_groups():
        assert list(group) == sorted(group, key=g.position)


# --------------------------------------------------------------------------- execution edges


@pytest.mark.parametrize(
    ("producers", "consumers", "expected"),
    [
        (2, 4, [(0, 0), (0, 0), (1, 1), (1, 1)]),
        (4, 2, [(0, 1), (2, 3)]),
        (3, 3, [(0, 0), (1, 1), (2, 2)]),
        (3, 2, [(0, 0), (1, 2)]),
        (2, 3, [(0, 0), (0, 0), (1, 1)]),
        (5, 1, [(0, 4)]),
    ],
)
def test_pointwise_rule_matches_flink(
    producers: int, consumers: int, expected: list[tuple[int, int]]
) -> None:
    assert [pointwise_producers(producers, consumers, k) for k in range(consumers)] == expected


def test_pointwise_rule_covers_every_producer_exactly_once_when_fanning_in() -> None:
    for p in range(1, 12):
        for c in range(1, p + 1):
            covered = [
                j for k in range(c) for j in range(*_inclusive(pointwise_producers(p, c, k)))
            ]
            assert covered == list(range(p))


def _inclusive(r: tuple[int, int]) -> tuple[int, int]:
    return (r[0], r[1] + 1)


def test_all_to_all_connects_every_pair() -> None:
    t = ExecutionTopology(JobGraph(graph("AB", ("A", "B", A2A, BLOCKING))), {"A": 3, "B": 2})
    assert names(t.producers_of("B", 1)) == {"A1", "A2", "A3"}
    assert names(t.consumers_of("A", 0)) == {"B1", "B2"}
    assert t.region_count == 5
    assert t.region_producers(t.region_index("B", 0)) == tuple(
        sorted(t.region_index("A", j) for j in range(3))
    )


def test_forward_is_one_to_one() -> None:
    t = ExecutionTopology(JobGraph(graph("AB", ("A", "B", FWD, BLOCKING))), {"A": 3, "B": 3})
    assert [names(t.producers_of("B", k)) for k in range(3)] == [{"A1"}, {"A2"}, {"A3"}]
    assert names(t.consumers_of("A", 2)) == {"B3"}


def test_declared_ranges_override_the_rule() -> None:
    # A decider gave B[0] producers 0..2 and B[1] producers 3..3 of a POINTWISE edge.
    declared = (
        SubtaskInputs(0, (InputRange("A", 0, 2, 0, 0),)),
        SubtaskInputs(1, (InputRange("A", 3, 3, 0, 0),)),
    )
    t = ExecutionTopology(
        JobGraph(graph("AB", ("A", "B", PW, PIPELINED))), {"A": 4, "B": 2}, {"B": declared}
    )
    assert names(t.producers_of("B", 0)) == {"A1", "A2", "A3"}
    assert names(t.consumers_of("A", 3)) == {"B2"}
    assert sorted(names(r.tasks) for r in t.regions()) == sorted(
        [{"A1", "A2", "A3", "B1"}, {"A4", "B2"}], key=sorted
    )


def test_full_declared_ranges_on_all_to_all_are_all_producers() -> None:
    declared = tuple(SubtaskInputs(k, (InputRange("A", 0, 2, k, k),)) for k in range(2))
    t = ExecutionTopology(
        JobGraph(graph("AB", ("A", "B", A2A, BLOCKING))), {"A": 3, "B": 2}, {"B": declared}
    )
    assert names(t.producers_of("B", 1)) == {"A1", "A2", "A3"}


def test_uninitialised_vertices_are_left_out() -> None:
    t = ExecutionTopology(
        JobGraph(graph("ABC", ("A", "B", A2A, BLOCKING), ("B", "C", FWD, PIPELINED))),
        {"A": 2, "B": 2},
    )
    assert t.vertices == ("A", "B")
    assert not t.contains("C", 0)
    assert t.region_consumers(t.region_index("B", 0)) == ()


# --------------------------------------------------------------------------- regions


def test_region_producers_and_consumers_cross_blocking_edges_only() -> None:
    spec = graph("ABC", ("A", "B", FWD, PIPELINED), ("B", "C", A2A, BLOCKING))
    t = ExecutionTopology(JobGraph(spec), {"A": 2, "B": 2, "C": 1})
    ab0 = t.region_index("A", 0)
    assert t.region_of("B", 0).index == ab0
    c0 = t.region_index("C", 0)
    assert t.region_consumers(ab0) == (c0,)
    assert t.region_producers(c0) == tuple(sorted({ab0, t.region_index("A", 1)}))
    assert names(t.region_input_tasks(c0)) == {"B1", "B2"}
    assert t.region_input_tasks(ab0) == ()


def test_regions_on_a_region_cycle_are_merged() -> None:
    # A->C pipelined makes {A, C}; A->B->C blocking would make {A,C} wait for B and B for A.
    spec = graph(
        "ABC", ("A", "C", FWD, PIPELINED), ("A", "B", FWD, BLOCKING), ("B", "C", FWD, BLOCKING)
    )
    t = ExecutionTopology(JobGraph(spec), {"A": 1, "B": 1, "C": 1})
    assert t.region_count == 1


def test_all_blocking_regions_for_100k_subtasks() -> None:
    # All-to-all connectivity stays at the vertex level: 40k x 40k execution edges would not
    # fit in memory, so this only completes if none are materialised. (Timing: benchmarks.)
    spec = graph("SMR", ("S", "M", A2A, BLOCKING), ("M", "R", A2A, BLOCKING))
    t = ExecutionTopology(JobGraph(spec), {"S": 40_000, "M": 40_000, "R": 20_000})
    regions = t.regions()
    assert len(regions) == 100_000
    assert all(len(r.tasks) == 1 for r in regions)


# --------------------------------------------------------------------------- properties

_DISTRIBUTIONS = st.sampled_from([FWD, PW, A2A, BC])
_EXCHANGES = st.sampled_from([BLOCKING, PIPELINED])


@st.composite
def job_topologies(draw: st.DrawFn) -> tuple[JobGraphSpec, dict[str, int]]:
    count = draw(st.integers(1, 5))
    names_ = [f"V{k}" for k in range(count)]
    edges = []
    for target in range(1, count):
        sources = draw(st.sets(st.integers(0, target - 1), max_size=2))
        for index, source in enumerate(sorted(sources)):
            edges.append(
                EdgeSpec(
                    names_[source], names_[target], draw(_DISTRIBUTIONS), draw(_EXCHANGES), index
                )
            )
    parallelism = {n: draw(st.integers(1, 4)) for n in names_}
    return JobGraphSpec(tuple(vertex(n) for n in names_), tuple(edges)), parallelism


def _reference_regions(t: ExecutionTopology) -> set[frozenset[TaskRef]]:
    """Connected components over explicit pipelined execution edges, by plain search."""
    neighbours: dict[TaskRef, set[TaskRef]] = {task: set() for task in t.tasks()}
    for v in t.vertices:
        for k in range(t.parallelism[v]):
            for spec, producers in t.input_producers(v, k):
                if spec.exchange is PIPELINED:
                    for j in producers:
                        neighbours[TaskRef(v, k)].add(TaskRef(spec.source, j))
                        neighbours[TaskRef(spec.source, j)].add(TaskRef(v, k))
    components: set[frozenset[TaskRef]] = set()
    seen: set[TaskRef] = set()
    for start in neighbours:
        if start in seen:
            continue
        stack, component = [start], set()
        while stack:
            task = stack.pop()
            if task in component:
                continue
            component.add(task)
            stack.extend(neighbours[task] - component)
        seen |= component
        components.add(frozenset(component))
    return components


def _region_graph_is_acyclic(t: ExecutionTopology) -> bool:
    indegree = {r: len(t.region_producers(r)) for r in range(t.region_count)}
    ready = [r for r, d in indegree.items() if d == 0]
    visited = 0
    while ready:
        r = ready.pop()
        visited += 1
        for c in t.region_consumers(r):
            indegree[c] -= 1
            if indegree[c] == 0:
                ready.append(c)
    return visited == t.region_count


@settings(max_examples=examples(150), deadline=None)
@given(job_topologies())
def test_regions_partition_tasks_along_pipelined_edges(
    case: tuple[JobGraphSpec, dict[str, int]],
) -> None:
    spec, parallelism = case
    t = ExecutionTopology(JobGraph(spec), parallelism)
    regions = {frozenset(r.tasks) for r in t.regions()}
    # Every task in exactly one region.
    assert sum(len(r.tasks) for r in t.regions()) == sum(parallelism.values())
    # Regions are unions of pipelined components (merged only where they form a cycle).
    reference = _reference_regions(t)
    for component in reference:
        assert any(component <= region for region in regions)
    # Components are merged only where they would form a cycle of regions, so the result is
    # always acyclic (schedulable one region after another).
    assert len(regions) <= len(reference)
    assert _region_graph_is_acyclic(t)
    for region in t.regions():
        for task in region.tasks:
            assert t.region_of(task.vertex, task.subtask) == region
        # Producer and consumer views agree.
        for producer in t.region_producers(region.index):
            assert region.index in t.region_consumers(producer)


@settings(max_examples=examples(100), deadline=None)
@given(job_topologies())
def test_producer_and_consumer_views_agree(case: tuple[JobGraphSpec, dict[str, int]]) -> None:
    spec, parallelism = case
    t = ExecutionTopology(JobGraph(spec), parallelism)
    for task in t.tasks():
        for producer in t.producers_of(task.vertex, task.subtask):
            assert task in t.consumers_of(producer.vertex, producer.subtask)


@settings(max_examples=examples(100), deadline=None)
@given(job_topologies())
def test_all_blocking_needs_one_slot_and_all_pipelined_at_least_max_parallelism(
    case: tuple[JobGraphSpec, dict[str, int]],
) -> None:
    spec, parallelism = case
    assert minimum_slots(spec, parallelism, DataExchangeMode.ALL_EDGES_BLOCKING) == 1
    slots = minimum_slots(spec, parallelism, DataExchangeMode.ALL_EDGES_PIPELINED)
    assert 1 <= slots <= max(parallelism.values())
    forward = minimum_slots(spec, parallelism, DataExchangeMode.FORWARD_EDGES_PIPELINED)
    pointwise = minimum_slots(spec, parallelism, DataExchangeMode.POINTWISE_EDGES_PIPELINED)
    assert forward <= pointwise <= slots
