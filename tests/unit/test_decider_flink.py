"""The default decider reproduces Flink 2.1's DefaultVertexParallelismAndInputInfosDecider.

Each case names the Flink class whose rule it follows. The ALL_TO_ALL cases take the inputs of
Flink's own `DefaultVertexParallelismAndInputInfosDeciderTest` (same bytes, bounds and volume);
the expected values are derived by hand from the 2.1 rules in the docstrings (for the mixed
POINTWISE case they differ from the pre-2.0 test, whose rules were different). The POINTWISE
slicing case is the example in `PointwiseVertexInputInfoComputer`'s javadoc.
"""

from __future__ import annotations

import pytest
from decider_history import Sim, edge, op, source, vol

from tailguard.decider.policy import ParallelismDecider
from tailguard.decider.policy.assign import InputInfo
from tailguard.decider.policy.flink import compute_vertex_inputs
from tailguard.decider.policy.slices import (
    count_packs,
    data_volume_share,
    find_max_legal_value,
    find_min_legal_value,
    pack,
    try_slice_ranges,
)
from tailguard.model import records as r
from tailguard.model.config import Settings
from tailguard.model.records import Distribution, InputRange

A2A = Distribution.ALL_TO_ALL
PW = Distribution.POINTWISE
FWD = Distribution.FORWARD
BC = Distribution.BROADCAST
KEY = "execution.batch.adaptive.auto-parallelism."
FLINK_BYTES_1 = (10, 15, 13, 12, 1, 10, 8, 20, 12, 17)
FLINK_BYTES_2 = (8, 12, 21, 9, 13, 7, 19, 13, 14, 5)


def a2a(name: str, sizes: tuple[int, ...], dist: Distribution = A2A) -> InputInfo:
    """One producer partition writing `sizes` (Flink's createAllToAllBlockingResultInfo)."""
    return InputInfo(name, dist, 1, len(sizes), (sum(sizes),), sizes, (sizes,))


def pointwise(name: str, *partitions: tuple[int, ...], dist: Distribution = PW) -> InputInfo:
    nsub = len(partitions[0])
    totals = tuple(sum(col) for col in zip(*partitions, strict=True))
    return InputInfo(
        name, dist, len(partitions), nsub, tuple(sum(p) for p in partitions), totals, partitions
    )


def subs(inputs: tuple[r.SubtaskInputs, ...], producer: str) -> list[tuple[int, int]]:
    out = []
    for s in inputs:
        (rng,) = [i for i in s.inputs if i.input == producer]
        out.append((rng.subpartition_start, rng.subpartition_end))
    return out


def decide(infos: list[InputInfo], low: int, high: int, volume: int) -> tuple[r.SubtaskInputs, ...]:
    """decideParallelismAndInputInfosForNonSource, P = ceil(S / V) clamped (decideParallelism)."""
    non_broadcast = sum(sum(i.partition_bytes or ()) for i in infos if i.distribution is not BC)
    parallelism = max(low, min(high, -(-non_broadcast // volume)))
    return compute_vertex_inputs(infos, parallelism, low, high, volume)


# ----------------------------------------------------------------------------- the utilities


def test_greedy_packing_closes_a_range_before_the_slice_that_would_exceed_the_limit():
    """VertexParallelismAndInputInfosDeciderUtils.computeSubpartitionSliceRanges: a sum equal
    to the limit still fits; a first slice above the limit gets a range of its own."""
    assert pack([5, 5, 5], 10) == [(0, 1), (2, 2)]
    assert pack([30, 1, 1], 10) == [(0, 0), (1, 2)]
    assert count_packs([5, 5, 5], 10) == 2
    # Empty slices pack together under any limit, even 0 (what a 0/0 share gives).
    assert pack([0, 0, 0], 0) == [(0, 2)]


def test_bisection_search_returns_minus_one_when_the_bound_is_not_legal():
    """BisectionSearchUtils.findMinLegalValue / findMaxLegalValue."""
    assert find_min_legal_value(lambda v: v >= 7, 0, 100) == 7
    assert find_min_legal_value(lambda v: v >= 700, 0, 100) == -1
    assert find_max_legal_value(lambda v: v <= 7, 0, 100) == 7
    assert find_max_legal_value(lambda v: v <= -3, 0, 100) == -1


def test_data_volume_share_truncates_and_is_zero_without_bytes():
    """VertexParallelismAndInputInfosDeciderUtils.calculateDataVolumePerTaskForInput:
    (long) (group / total × V); Java's 0.0 / 0 is NaN and (long) NaN is 0."""
    assert data_volume_share(60, 118, 239) == 29
    assert data_volume_share(60, 121, 239) == 30
    assert data_volume_share(60, 0, 0) == 0


# ----------------------------------------------------------------------------- ALL_TO_ALL


def test_all_edges_all_to_all_parallelism_is_the_greedy_count():
    """AllToAllVertexInputInfoComputer (testAllEdgesAllToAll): two joined inputs, summed per
    subpartition, packed under V = 60 -> 5 ranges, shared by both inputs."""
    infos = [a2a("x", FLINK_BYTES_1), a2a("y", FLINK_BYTES_2)]
    out = decide(infos, 1, 10, 60)
    expected = [(0, 1), (2, 3), (4, 6), (7, 8), (9, 9)]
    assert subs(out, "x") == expected and subs(out, "y") == expected


def test_count_above_max_searches_the_smallest_limit_that_fits():
    """VertexParallelismAndInputInfosDeciderUtils.adjustToClosestLegalParallelism
    (testAllEdgesAllToAllAndDecidedParallelismIsMaxParallelism): V = 10 gives 10 ranges, max 2."""
    out = decide([a2a("x", FLINK_BYTES_1)], 1, 2, 10)
    assert subs(out, "x") == [(0, 5), (6, 9)]


def test_count_below_min_searches_the_largest_limit_then_the_most_even_one():
    """adjustToClosestLegalParallelism (testAllEdgesAllToAllAndDecidedParallelismIsMinParallelism):
    V = 1000 packs everything in one range; min 4."""
    out = decide([a2a("x", FLINK_BYTES_1)], 4, 10, 1000)
    assert subs(out, "x") == [(0, 1), (2, 5), (6, 7), (8, 9)]


def test_falls_back_to_splitting_subpartitions_by_count():
    """tryComputeSubpartitionSliceRangeEvenlyDistributedSubpartitionSlices
    (testFallBackToEvenlyDistributeSubpartitions): no byte limit gives exactly 8 ranges."""
    out = decide([a2a("x", (10, 1) * 5)], 8, 8, 10)
    assert subs(out, "x") == [(0, 0), (1, 1), (2, 2), (3, 4), (5, 5), (6, 6), (7, 7), (8, 9)]


def test_broadcast_inputs_are_read_whole_and_not_packed():
    """AllToAllVertexInputInfoComputer (testAllEdgesAllToAllAndOneIsBroadcast)."""
    out = decide([a2a("x", FLINK_BYTES_1), a2a("b", (10,), BC)], 1, 10, 60)
    assert subs(out, "x") == [(0, 4), (5, 8), (9, 9)]
    assert subs(out, "b") == [(0, 0)] * 3


def test_only_broadcast_inputs_take_the_minimum():
    """DefaultVertexParallelismAndInputInfosDecider.decideParallelism (testAllEdgesBroadcast)."""
    out = decide([a2a("b", (10,), BC), a2a("c", (10,), BC)], 1, 10, 60)
    assert len(out) == 1


def test_a_fixed_parallelism_still_gets_byte_balanced_ranges():
    """decideParallelismAndInputInfosForNonSource (the inputs of testParallelismAlreadyDecided;
    2.1 packs by bytes where the old test split by count): min = max = 3, V = 1 GiB packs one
    range, so adjustToClosestLegalParallelism takes the largest limit giving ≥ 3 ranges (60:
    51 | 50 | 17) and then the smallest giving 3 (49: 38 | 31 | 49, since 48 gives 4)."""
    out = compute_vertex_inputs([a2a("x", FLINK_BYTES_1)], 3, 3, 3, 1 << 30)
    assert subs(out, "x") == [(0, 2), (3, 6), (7, 9)]


# ----------------------------------------------------------------------------- POINTWISE


def test_pointwise_input_is_cut_into_runs_of_partition_subpartition_slices():
    """PointwiseVertexInputInfoComputer (its javadoc example): {0->[1,2,1], 1->[2,1,2]} at
    parallelism 3 -> slices [1,2,1,2,1,2] -> runs [0,1] [2,3] [4,5] -> {0->[0,1]},
    {0->[2,2], 1->[0,0]}, {1->[1,2]}: more subtasks than the producer has partitions."""
    info = pointwise("p", (1, 2, 1), (2, 1, 2))
    out = compute_vertex_inputs([info], 3, 3, 3, 3)
    assert [s.inputs for s in out] == [
        (InputRange("p", 0, 0, 0, 1),),
        (InputRange("p", 0, 0, 2, 2), InputRange("p", 1, 1, 0, 0)),
        (InputRange("p", 1, 1, 1, 2),),
    ]


def test_mixed_inputs_share_v_in_proportion_to_their_bytes():
    """DefaultVertexParallelismAndInputInfosDecider.decideParallelismAndInputInfosForNonSource
    (the inputs of testHavePointwiseEdges, Flink 2.1's rules). S = 118 + 121 = 239, V = 60:
    P = ceil(239 / 60) = 4, pinned because a POINTWISE input is present. ALL_TO_ALL share
    (long)(118/239·60) = 29 packs 5 ranges -> smallest limit with ≤ 4 is 36. POINTWISE share 30
    packs 6 ranges -> smallest limit with ≤ 4 is 39 (13 + 7 + 19 = 39 still fits)."""
    x = a2a("x", FLINK_BYTES_1)
    p = pointwise("p", (8, 12, 21, 9, 13), (7, 19, 13, 14, 5))
    out = decide([x, p], 1, 10, 60)
    assert subs(out, "x") == [(0, 1), (2, 5), (6, 7), (8, 9)]
    assert [tuple(i for i in s.inputs if i.input == "p") for s in out] == [
        (InputRange("p", 0, 0, 0, 1),),
        (InputRange("p", 0, 0, 2, 3),),
        (InputRange("p", 0, 0, 4, 4), InputRange("p", 1, 1, 0, 1)),
        (InputRange("p", 1, 1, 2, 4),),
    ]


def test_forward_input_is_sliced_by_whole_partitions():
    """PointwiseVertexInputInfoComputer with intra-input key correlation: a partition is never
    split, so a forward consumer at its producer's parallelism reads partition i in subtask i."""
    info = pointwise("f", (9, 0), (1, 1), (0, 5), dist=FWD)
    out = compute_vertex_inputs([info], 3, 3, 3, 1)
    assert [s.inputs for s in out] == [(InputRange("f", k, k, 0, 1),) for k in range(3)]


def test_try_slice_ranges_prefers_bytes_then_counts():
    """VertexParallelismAndInputInfosDeciderUtils.tryComputeSubpartitionSliceRange."""
    assert try_slice_ranges(2, 2, 10, [5, 5, 5, 5]) == [(0, 1), (2, 3)]
    assert try_slice_ranges(5, 5, 10, [5, 5, 5, 5]) is None  # fewer slices than the minimum


# ----------------------------------------------------------------------------- the service


def flink_sim(sizes: tuple[int, ...], **config: str) -> Sim:
    return Sim(
        [source("A", (1,), parallelism=1), op("B", max_parallelism=len(sizes))],
        [edge("A", "B", A2A)],
        config={**vol(60), **{KEY + k: v for k, v in config.items()}},
        decider=ParallelismDecider(Settings()),
    )


def test_the_service_decides_as_flink_by_default():
    sim = flink_sim(FLINK_BYTES_1)
    sim.submit()
    sim.initialize("A", 1)
    (d,) = sim.finish("A", 0, FLINK_BYTES_1)
    assert isinstance(d, r.SetParallelism)
    # 118 bytes: Flink's P = ceil(118/60) = 2 is only the fallback; the greedy count decides.
    assert d.parallelism == 3
    assert subs(d.subtask_inputs, "A") == [(0, 4), (5, 8), (9, 9)]


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        # normalize-to-power-of-two pins P = 2 (ceil(118/60) = 2, already a power of two).
        ({"normalize-to-power-of-two": "true"}, 2),
        # min-parallelism searches the limit (Flink's adjustToClosestLegalParallelism).
        ({"min-parallelism": "4"}, 4),
        ({"max-parallelism": "2"}, 2),
    ],
)
def test_options_and_bounds(config: dict[str, str], expected: int):
    sim = flink_sim(FLINK_BYTES_1, **config)
    sim.run(lambda name, nsub, k: FLINK_BYTES_1 if name == "A" else (1,) * nsub)
    assert sim.decisions["B"].parallelism == expected


def test_optimal_algorithm_is_kept_as_an_option():
    sim = flink_sim(FLINK_BYTES_1)
    sim.config["decider.algorithm"] = "optimal"
    sim.run(lambda name, nsub, k: FLINK_BYTES_1 if name == "A" else (1,) * nsub)
    assert sim.decisions["B"].parallelism == 2  # ceil(118 / 60)


def test_fixed_operator_not_yet_initialised_gets_byte_balanced_ranges():
    """The agent may leave a fixed vertex to the decider; it then gets Flink's ranges."""
    sim = Sim(
        [source("A", (1,), parallelism=1), op("B", parallelism=3, max_parallelism=10)],
        [edge("A", "B", A2A)],
        config=vol(1 << 30),
    )
    sim.submit()
    sim.initialize("A", 1)
    (d,) = sim.finish("A", 0, FLINK_BYTES_1)
    assert isinstance(d, r.SetParallelism) and d.parallelism == 3
    assert subs(d.subtask_inputs, "A") == [(0, 2), (3, 6), (7, 9)]


def test_source_upper_bound_is_default_source_parallelism_or_global_max_and_vertex_max():
    """DefaultVertexParallelismAndInputInfosDecider.computeSourceParallelismUpperBound; the
    source's own inference (one task per V of splits) stays below it; min-parallelism does not
    apply to sources."""
    sim = Sim(
        [source("S", (100,) * 12, max_parallelism=5)],
        [],
        config={**vol(100), KEY + "min-parallelism": "8"},
    )
    (d,) = sim.submit()
    assert isinstance(d, r.SetParallelism) and d.parallelism == 5
    sim = Sim([source("S", (100,) * 12)], [], config={**vol(400)})
    (d,) = sim.submit()
    assert isinstance(d, r.SetParallelism) and d.parallelism == 3
