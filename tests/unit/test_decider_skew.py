"""Skewed join splitting in the decider (Flink 2.x's adaptive skewed join, `policy/skew.py`).

Rule by rule: Flink's threshold, target size and partition cut; which side each join type lets
split; the decision through the service, with `skew_splits`; and Hypothesis properties over
random byte matrices: every (partition, subpartition) of a split side is read exactly once,
every piece reads the other side's whole matching subpartition, and each pair of rows that can
meet (one from each side, same subpartition) meets in exactly one subtask.
"""

from __future__ import annotations

from collections import Counter

import pytest
from decider_history import Sim, edge, op, source, vol
from hypothesis import given, settings
from hypothesis import strategies as st

from examples_budget import examples
from tailguard.decider.policy import ParallelismDecider
from tailguard.decider.policy.assign import InputInfo
from tailguard.decider.policy.skew import (
    SPLITTABLE,
    SkewParams,
    median,
    partition_ranges,
    plan_skew,
    rectangles,
    skew_threshold,
    split_cuts,
    target_size,
)
from tailguard.decider.policy.slices import try_slice_ranges
from tailguard.inspect.describe import describe
from tailguard.model import records as r
from tailguard.model.config import ConfigError, Settings
from tailguard.model.records import Distribution, InputRange

A2A = Distribution.ALL_TO_ALL
SKEW = "table.optimizer.skewed-join-optimization."
MB = 1_000_000


def matrix_input(name: str, rows: list[list[int]]) -> InputInfo:
    """A producer with one row of subpartition bytes per partition."""
    nsub = len(rows[0])
    return InputInfo(
        name,
        A2A,
        len(rows),
        nsub,
        tuple(sum(row) for row in rows),
        tuple(sum(col) for col in zip(*rows, strict=True)),
        tuple(tuple(row) for row in rows),
    )


# ------------------------------------------------------------------ Flink's helpers


def test_median_is_flinks_floored_and_at_least_one():
    assert median([5, 1, 3]) == 3
    assert median([1, 2, 3, 4]) == 2  # (2 + 3) / 2 in Java's long division
    assert median([0, 0]) == 1


def test_threshold_is_the_larger_of_factor_times_median_and_the_floor():
    assert skew_threshold(100, 4.0, 256) == 400
    assert skew_threshold(10, 4.0, 256) == 256
    assert skew_threshold(3, 1.5, 0) == 4  # (long) 4.5


def test_target_size_is_the_mean_of_the_subpartitions_not_skewed_or_the_volume():
    assert target_size([10, 20, 1000], 100, 5) == 15
    assert target_size([10, 20, 1000], 100, 50) == 50
    assert target_size([1000, 2000], 100, 7) == 7  # nothing below the threshold


def test_partition_cut_opens_a_run_before_reaching_the_target():
    # Flink's `computePartitionRangesEvenlyData` compares with <: 10 + 10 = 20 is not < 20.
    assert partition_ranges([10, 10, 10, 10], 20) == [(0, 0), (1, 1), (2, 2), (3, 3)]
    assert partition_ranges([10, 10, 10, 10], 21) == [(0, 1), (2, 3)]
    assert partition_ranges([50, 1, 1], 10) == [(0, 0), (1, 2)]


def test_settings_take_flinks_keys_and_check_them():
    assert SkewParams.from_settings(Settings()) == SkewParams("auto", 4.0, 256 * 1024 * 1024)
    with pytest.raises(ConfigError, match="strategy"):
        SkewParams.from_settings(Settings().for_job({SKEW + "strategy": "sometimes"}))


# ------------------------------------------------------------------ which side splits

HOT = [[10, 10, 400, 10], [10, 10, 400, 10], [10, 10, 400, 10], [10, 10, 400, 10]]
COLD = [[10, 10, 10, 10]] * 4
LOW = SkewParams("auto", 4.0, 0)


@pytest.mark.parametrize(
    ("join", "hot_side", "split"),
    [
        ("inner", 0, True),
        ("inner", 1, True),
        ("left", 0, True),
        ("left", 1, False),
        ("semi", 0, True),
        ("anti", 1, False),
        ("right", 1, True),
        ("right", 0, False),
        ("full", 0, False),
        (None, 0, False),
    ],
)
def test_the_join_type_decides_which_side_may_be_split(join, hot_side, split):
    sides = [COLD, COLD]
    sides[hot_side] = HOT
    infos = [matrix_input("L", sides[0]), matrix_input("R", sides[1])]
    plan = plan_skew(infos, join, LOW, 40)
    assert (plan is not None) is split
    if plan is not None:
        (hot,) = plan.splits
        assert (hot.input, hot.subpartition, hot.bytes) == ("LR"[hot_side], 2, 1600)
        assert hot.threshold == 4 * 40 and hot.pieces == 4


def test_strategy_none_a_broadcast_input_or_a_self_join_never_split():
    infos = [matrix_input("L", HOT), matrix_input("R", COLD)]
    assert plan_skew(infos, "inner", SkewParams("none", 4.0, 0), 40) is None
    broadcast = InputInfo("R", Distribution.BROADCAST, 4, 4, (40,) * 4, (40,) * 4, ((10,) * 4,) * 4)
    assert plan_skew([infos[0], broadcast], "inner", LOW, 40) is None
    assert plan_skew([infos[0], matrix_input("L", HOT)], "inner", LOW, 40) is None


def test_below_the_threshold_floor_nothing_is_split():
    infos = [matrix_input("L", HOT), matrix_input("R", COLD)]
    assert plan_skew(infos, "inner", SkewParams("auto", 4.0, 2000), 40) is None


def test_a_range_across_two_rows_of_a_both_sides_split_is_cut_into_products():
    left = matrix_input("L", [[1, 500], [500, 500], [1, 900]])
    right = matrix_input("R", [[1, 900], [500, 900], [0, 900]])
    plan = plan_skew([left, right], "inner", SkewParams("auto", 1.5, 0), 1003)
    assert plan is not None
    # Subpartition 1: left pieces A1, A2 x right pieces B1, B2, B3 at positions 1..6.
    assert plan.blocks == ((0, 1, 1), (1, 2, 3))
    packed = try_slice_ranges(1, 2, 1003, plan.slice_bytes(), plan.parts())
    # (A1,B3),(A2,B1),(A2,B2),(A2,B3) would read A1+A2 and B1..B3, and join A1 with B1 and B2
    # a second time (the first range does too).
    assert packed == [(0, 2), (3, 6)]
    assert rectangles(plan, packed) == [(0, 2), (3, 3), (4, 6)]
    # Three products exceed the maximum of 2: the vertex is decided without splitting.
    assert split_cuts(plan, 1, 2, 1003) is None


# ------------------------------------------------------------------ through the service


def skew_sim(join: str | None, **config: str) -> Sim:
    """Two producers of 4 partitions hash-partitioned into 8 subpartitions for join J."""
    policy = {SKEW + k: v for k, v in config.items()}
    return Sim(
        [
            source("L", (1,), parallelism=4),
            source("R", (1,), parallelism=4),
            op("J", max_parallelism=8, join=join),
        ],
        [edge("L", "J", A2A, 0), edge("R", "J", A2A, 1)],
        config={**vol(80 * MB), **policy},
        decider=ParallelismDecider(Settings()),
    )


def run_join(join: str | None, **config: str) -> r.SetParallelism:
    """L's subpartition 2 holds 40x the median (400 MB in each partition, 10 MB elsewhere: both
    sides too large to broadcast)."""
    sim = skew_sim(join, **config)
    sim.run(
        lambda name, nsub, k: tuple(
            (400 if name == "L" and s == 2 else 10) * MB for s in range(nsub)
        )
    )
    decision = sim.decisions["J"]
    assert isinstance(decision, r.SetParallelism)
    return decision


def readers_of(decision: r.SetParallelism, producer: str, sub: int) -> list[InputRange]:
    return [
        rng
        for s in decision.subtask_inputs
        for rng in s.inputs
        if rng.input == producer and rng.subpartition_start <= sub <= rng.subpartition_end
    ]


def test_the_service_splits_a_hot_subpartition_and_says_so():
    decision = run_join("inner", **{"skewed-threshold": "0"})
    (split,) = decision.skew_splits
    assert (split.input, split.subpartition) == ("L", 2)
    hot = readers_of(decision, "L", 2)
    assert len(hot) == split.pieces > 1
    assert sorted((x.partition_start, x.partition_end) for x in hot)[0][0] == 0
    # Each piece's subtask reads the right side's whole subpartition 2.
    for s in decision.subtask_inputs:
        if any(
            x.input == "L" and x.subpartition_start <= 2 <= x.subpartition_end for x in s.inputs
        ):
            right = [x for x in s.inputs if x.input == "R" and x.subpartition_start <= 2]
            assert any(x.partition_start == 0 and x.partition_end == 3 for x in right)
    assert decision.parallelism == len(decision.subtask_inputs) > 4


def test_explain_says_which_subpartition_was_split_and_why():
    decision = run_join("inner", **{"skewed-threshold": "0"})
    (split,) = decision.skew_splits
    text = describe(decision, 0)
    assert text.startswith(f"J: parallelism {decision.parallelism}, skewed join split: ")
    assert (
        f"L subpartition 2 ({split.bytes} bytes, above the skew threshold {split.threshold}) "
        f"into {split.pieces} pieces of its partitions" in text
    )


def test_a_subpartition_within_the_factor_and_a_full_join_stay_whole():
    within = run_join("inner", **{"skewed-factor": "50", "skewed-threshold": "0"})  # 40x
    full = run_join("full", **{"skewed-threshold": "0"})
    for decision in (within, full):
        assert decision.skew_splits == ()
        assert len(readers_of(decision, "L", 2)) == 1


# ------------------------------------------------------------------ properties

matrices = st.integers(1, 4).flatmap(
    lambda partitions: st.integers(1, 5).flatmap(
        lambda nsub: st.tuples(
            *(
                st.lists(
                    st.lists(st.integers(0, 50), min_size=nsub, max_size=nsub)
                    | st.lists(st.sampled_from([0, 1, 500, 900]), min_size=nsub, max_size=nsub),
                    min_size=partitions,
                    max_size=partitions,
                )
                for _ in range(2)
            )
        )
    )
)


def cells(ranges: list[InputRange], producer: str) -> Counter[tuple[int, int]]:
    out: Counter[tuple[int, int]] = Counter()
    for rng in ranges:
        if rng.input == producer:
            for p in range(rng.partition_start, rng.partition_end + 1):
                for s in range(rng.subpartition_start, rng.subpartition_end + 1):
                    out[(p, s)] += 1
    return out


@settings(max_examples=examples(300), deadline=None)
@given(
    sides=matrices,
    join=st.sampled_from(sorted(SPLITTABLE)),
    factor=st.sampled_from([1.0, 1.5, 4.0]),
    volume=st.integers(1, 4000),
    low=st.integers(1, 3),
    high=st.integers(1, 8),
)
def test_split_ranges_cover_each_cell_once_and_each_piece_reads_the_other_side(
    sides, join, factor, volume, low, high
):
    left, right = matrix_input("L", sides[0]), matrix_input("R", sides[1])
    plan = plan_skew([left, right], join, SkewParams("auto", factor, 0), volume)
    if plan is None:
        return
    cuts = split_cuts(plan, min(low, high), high, volume)
    if cuts is None:
        return
    subtasks = [list(a) + list(b) for a, b in zip(cuts[0], cuts[1], strict=True)]
    assert all(subtasks) and len(subtasks) <= high
    split_inputs = {x.input for x in plan.splits}
    nsub = left.subpartitions
    for s in range(nsub):
        # Every pair (left partition, right partition) of subpartition s meets exactly once.
        pairs: Counter[tuple[int, int]] = Counter()
        for ranges in subtasks:
            ls = [p for (p, sub) in cells(ranges, "L") if sub == s]
            rs = [p for (p, sub) in cells(ranges, "R") if sub == s]
            pairs.update((a, b) for a in ls for b in rs)
        assert pairs == Counter(
            {(a, b): 1 for a in range(left.parallelism) for b in range(right.parallelism)}
        )
    for side, other in (("L", "R"), ("R", "L")):
        if side not in split_inputs or other in split_inputs:
            continue
        # One side split, the other whole: each cell of the split side is read exactly once,
        # and a subtask reading any of subpartition s of it reads all of the other side's s.
        total = Counter[tuple[int, int]]()
        for ranges in subtasks:
            mine = cells(ranges, side)
            total.update(mine)
            theirs = cells(ranges, other)
            others = left.parallelism if other == "L" else right.parallelism
            for s in {sub for (_, sub) in mine}:
                assert all(theirs[(p, s)] == 1 for p in range(others))
        assert set(total.values()) == {1}
        assert len(total) == (left if side == "L" else right).parallelism * nsub
