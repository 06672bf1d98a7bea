"""Property tests for the decider over generated job graphs and histories: bounds, coverage of
every subpartition / partition / split exactly once, shared join ranges, forward groups,
liveness and determinism; plus the range cutters on their own."""

from __future__ import annotations

import itertools
import random

from decider_history import Sim, edge, op, source
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.examples_budget import examples

from tailguard.decider.policy.ranges import balanced_ranges, count_ranges, range_sums
from tailguard.model import records as r
from tailguard.model.records import SPLITS_INPUT, Distribution

A2A = Distribution.ALL_TO_ALL
KEY = "execution.batch.adaptive.auto-parallelism."


# ----------------------------------------------------------------------------- generators


@st.composite
def jobs(draw: st.DrawFn) -> tuple[list[r.VertexSpec], list[r.EdgeSpec], dict[str, str], int]:
    maxp = draw(st.integers(1, 16))
    config = {
        KEY + "max-parallelism": str(maxp),
        KEY + "min-parallelism": str(draw(st.integers(1, 4))),
        KEY + "avg-data-volume-per-task": f"{draw(st.integers(20, 3000))} b",
        KEY + "normalize-to-power-of-two": draw(st.sampled_from(["true", "false"])),
        KEY + "default-source-parallelism": str(draw(st.sampled_from([0, 0, 2, 5]))),
    }
    vertices: list[r.VertexSpec] = []
    edges: list[r.EdgeSpec] = []
    for i in range(draw(st.integers(1, 3))):
        splits = tuple(draw(st.lists(st.integers(0, 500), min_size=1, max_size=8)))
        fixed = draw(st.none() | st.integers(1, len(splits)))
        vertices.append(source(f"s{i}", splits, parallelism=fixed))
    for i in range(draw(st.integers(1, 4))):
        name = f"o{i}"
        producers = draw(
            st.lists(
                st.sampled_from([v.name for v in vertices]), min_size=1, max_size=2, unique=True
            )
        )
        dists = [draw(st.sampled_from(list(Distribution))) for _ in producers]
        vmax = draw(st.none() | st.integers(1, 16))
        fixed = None
        # A fixed parallelism is only always feasible over inputs that do not bound it by
        # the producer's parallelism (the agent's graph API makes the same choice).
        if all(d in (A2A, Distribution.BROADCAST) for d in dists):
            fixed = draw(st.none() | st.integers(1, vmax or maxp))
        vertices.append(op(name, parallelism=fixed, max_parallelism=vmax))
        edges += [
            edge(p, name, d, index=k) for k, (p, d) in enumerate(zip(producers, dists, strict=True))
        ]
    seed = draw(st.integers(0, 2**32))
    return vertices, edges, config, seed


def sizes_from(seed: int):
    def sizes(name: str, nsub: int, subtask: int) -> tuple[int, ...]:
        rnd = random.Random(f"{seed}/{name}/{subtask}")
        out = [rnd.choice([0, rnd.randint(0, 50), rnd.randint(0, 400)]) for _ in range(nsub)]
        if nsub > 1 and rnd.random() < 0.3:
            out[rnd.randrange(nsub)] *= 10  # a skewed key
        return tuple(out)

    return sizes


def simulate(job) -> Sim:
    vertices, edges, config, seed = job
    sim = Sim(list(vertices), list(edges), dict(config))
    sim.run(sizes_from(seed))
    return sim


# ----------------------------------------------------------------------------- invariants


def assert_cover(ranges: list[tuple[int, int]], n: int) -> None:
    """Contiguous, in order, non-empty, covering 0..n-1 exactly once."""
    assert ranges, "no ranges"
    assert ranges[0][0] == 0 and ranges[-1][1] == n - 1
    for (s, e), (s2, _) in itertools.pairwise(ranges):
        assert s <= e and s2 == e + 1
    assert ranges[-1][0] <= ranges[-1][1]


def pairs_of(rngs: list[r.InputRange]) -> list[tuple[int, int]]:
    """The (partition, subpartition) pairs a subtask reads of one input, in reading order."""
    return [
        (p, sp)
        for x in sorted(rngs, key=lambda x: (x.partition_start, x.subpartition_start))
        for p in range(x.partition_start, x.partition_end + 1)
        for sp in range(x.subpartition_start, x.subpartition_end + 1)
    ]


def check_ranges(sim: Sim, vertex: str, parallelism: int, inputs: tuple[r.SubtaskInputs, ...]):
    assert [s.subtask for s in inputs] == list(range(parallelism))
    in_edges = sim.inputs(vertex)
    if not in_edges:
        splits = sim.spec(vertex).split_bytes
        given_splits = [s.inputs[0] for s in inputs if s.inputs]
        assert all(g.input == SPLITS_INPUT for g in given_splits)
        assert_cover([(g.partition_start, g.partition_end) for g in given_splits], len(splits))
        # Only a subtask beyond the number of splits may read nothing (fixed sources).
        assert len(given_splits) == min(parallelism, len(splits))
        return
    by_nsub: dict[int, list[list[tuple[int, int]]]] = {}
    for e in in_edges:
        pp = sim.initialized[e.source].parallelism
        nsub = sim.subpartitions(e.source)
        per_subtask = [[i for i in s.inputs if i.input == e.source] for s in inputs]
        if e.distribution is not Distribution.POINTWISE:
            # One range per input, except POINTWISE runs that cut partitions.
            assert all(len(rs) == 1 for rs in per_subtask), per_subtask
        rngs = [rs[0] for rs in per_subtask]
        parts = [(x.partition_start, x.partition_end) for x in rngs]
        subs = [(x.subpartition_start, x.subpartition_end) for x in rngs]
        if e.distribution is A2A:
            assert set(parts) == {(0, pp - 1)}
            assert_cover(subs, nsub)
            by_nsub.setdefault(nsub, []).append(subs)
        elif e.distribution is Distribution.BROADCAST:
            assert set(parts) == {(0, pp - 1)} and set(subs) == {(0, nsub - 1)}
        elif e.distribution is Distribution.FORWARD:
            assert set(subs) == {(0, nsub - 1)}
            assert_cover(parts, pp)
        else:
            # POINTWISE: every (partition, subpartition) read once, each subtask a contiguous
            # non-empty run of them in partition-major order.
            runs = [pairs_of(rs) for rs in per_subtask]
            assert all(runs)
            assert [pair for run in runs for pair in run] == [
                (p, sp) for p in range(pp) for sp in range(nsub)
            ]
            assert all(len(rs) <= 3 for rs in per_subtask)
    for cuts in by_nsub.values():
        assert all(c == cuts[0] for c in cuts), "join inputs must share subpartition ranges"


def greedy_ranges(weights: list[int], limit: int) -> list[tuple[int, int]]:
    """Flink's computeSubpartitionSliceRanges, restated: a range closes before the slice that
    would take it above the limit; a range's first slice is always taken."""
    ranges: list[tuple[int, int]] = []
    for i in range(len(weights)):
        if ranges and sum(weights[ranges[-1][0] : i + 1]) <= limit:
            ranges[-1] = (ranges[-1][0], i)
        else:
            ranges.append((i, i))
    return ranges


def check_flink_packing(sim: Sim, name: str, d: r.SetParallelism, config: dict[str, str]) -> None:
    """DefaultVertexParallelismAndInputInfosDecider: when greedy packing of the ALL_TO_ALL
    subpartitions under V gives a count inside [min, max], that count is the parallelism and
    those are the ranges, so no subtask reads more than V unless one subpartition alone is
    more than V."""
    in_edges = sim.inputs(name)
    if not in_edges or any(e.distribution is not A2A for e in in_edges):
        return
    if (
        sim.spec(name).parallelism is not None
        or config[KEY + "normalize-to-power-of-two"] == "true"
    ):
        return
    leader_fixed = any(
        e.distribution is Distribution.FORWARD for e in sim.edges if name in (e.source, e.target)
    )
    if leader_fixed:
        return
    nsubs = {sim.subpartitions(e.source) for e in in_edges}
    if len(nsubs) != 1:
        return
    (nsub,) = nsubs
    volume = int(config[KEY + "avg-data-volume-per-task"].split()[0])
    weights = [0] * nsub
    for e in in_edges:
        for k in range(sim.initialized[e.source].parallelism):
            sizes = next(
                x
                for x in sim.log
                if isinstance(x, r.AttemptFinished) and x.vertex == e.source and x.subtask == k
            ).bytes_per_subpartition
            weights = [a + b for a, b in zip(weights, sizes, strict=True)]
    maxp = int(config[KEY + "max-parallelism"])
    high = min(maxp, sim.spec(name).max_parallelism or maxp, nsub)
    low = min(int(config[KEY + "min-parallelism"]), sim.spec(name).max_parallelism or maxp, high)
    greedy = greedy_ranges(weights, volume)
    if not low <= len(greedy) <= high:
        return
    assert d.parallelism == len(greedy)
    assert sub_ranges_of(d, in_edges[0].source) == greedy
    for start, end in greedy:
        assert sum(weights[start : end + 1]) <= volume or start == end


def sub_ranges_of(d: r.SetParallelism, producer: str) -> list[tuple[int, int]]:
    out = []
    for s in d.subtask_inputs:
        (rng,) = [i for i in s.inputs if i.input == producer]
        out.append((rng.subpartition_start, rng.subpartition_end))
    return out


@settings(max_examples=examples(150), deadline=None)
@given(jobs())
def test_decisions_are_bounded_complete_and_cover_every_input_exactly_once(job):
    sim = simulate(job)
    vertices, edges, config, _ = job
    maxp = int(config[KEY + "max-parallelism"])
    adaptive = {v.name for v in vertices if v.parallelism is None}
    fixed_operators = {v.name for v in vertices if v.parallelism is not None and sim.inputs(v.name)}
    # Liveness: the agent's loop ran to the end, every adaptive vertex was decided once; a
    # fixed vertex with inputs may be decided too (Flink 2.1 gives it byte-balanced ranges).
    assert adaptive <= set(sim.decisions) <= adaptive | fixed_operators
    assert set(sim.initialized) == {v.name for v in vertices}
    for name, d in sim.decisions.items():
        spec = sim.spec(name)
        if spec.parallelism is not None:
            assert d.parallelism == spec.parallelism
            continue
        assert 1 <= d.parallelism <= min(maxp, spec.max_parallelism or maxp)
        if not sim.inputs(name):
            assert d.parallelism <= len(spec.split_bytes)
        check_flink_packing(sim, name, d, config)
    for name, init in sim.initialized.items():
        check_ranges(sim, name, init.parallelism, init.subtask_inputs)
    if sim.decider.metrics()["forward_group_breaks"] == 0:
        for e in edges:
            if e.distribution is Distribution.FORWARD:
                assert (
                    sim.initialized[e.source].parallelism == sim.initialized[e.target].parallelism
                )


@settings(max_examples=examples(50), deadline=None)
@given(jobs())
def test_same_history_same_decisions(job):
    first, second = simulate(job), simulate(job)
    assert first.log == second.log
    assert first.decider.metrics() == second.decider.metrics()


# ----------------------------------------------------------------------------- range cutters


@given(st.lists(st.integers(0, 1000), min_size=1, max_size=40), st.data())
def test_balanced_ranges_cover_and_beat_or_match_count_ranges(weights, data):
    parts = data.draw(st.integers(1, len(weights)))
    ranges = balanced_ranges(weights, parts)
    assert len(ranges) == parts
    assert_cover(ranges, len(weights))
    assert max(range_sums(weights, ranges)) <= max(
        range_sums(weights, count_ranges(len(weights), parts))
    )


@given(st.lists(st.integers(0, 100), min_size=1, max_size=7), st.data())
def test_balanced_ranges_are_optimal(weights, data):
    parts = data.draw(st.integers(1, len(weights)))
    n = len(weights)
    best = min(
        max(
            range_sums(weights, list(zip((0, *cuts), (*(c - 1 for c in cuts), n - 1), strict=True)))
        )
        for cuts in itertools.combinations(range(1, n), parts - 1)
    )
    assert max(range_sums(weights, balanced_ranges(weights, parts))) == best


@given(st.integers(1, 300), st.data())
def test_count_ranges_cover(n, data):
    parts = data.draw(st.integers(1, n))
    ranges = count_ranges(n, parts)
    assert len(ranges) == parts
    assert_cover(ranges, n)
    sizes = [e - s + 1 for s, e in ranges]
    assert max(sizes) - min(sizes) <= 1
