"""ParallelismDecider under `decider.algorithm = optimal` (tailguard 1.0's rule, kept as an
option) and the rules every algorithm shares: FLIP-187's examples, the formula, bounds, forward
groups, joins, skew and sources. Flink 2.1's default is tested in `test_decider_flink.py`."""

from __future__ import annotations

import pytest
from decider_history import JOB, edge, op, source, vol
from decider_history import Sim as _Sim

from tailguard.decider.policy import ParallelismDecider, static_subtask_inputs
from tailguard.decider.policy.formula import closest_power_of_two
from tailguard.decider.policy.ranges import balanced_ranges, count_ranges, range_sums
from tailguard.model import records as r
from tailguard.model.config import Settings
from tailguard.model.ids import derived_id
from tailguard.model.records import SPLITS_INPUT, Distribution, InputRange, SubtaskInputs

A2A = Distribution.ALL_TO_ALL
FWD = Distribution.FORWARD
PW = Distribution.POINTWISE
BC = Distribution.BROADCAST
NORMALIZE = "execution.batch.adaptive.auto-parallelism.normalize-to-power-of-two"
MINP = "execution.batch.adaptive.auto-parallelism.min-parallelism"
MAXP = "execution.batch.adaptive.auto-parallelism.max-parallelism"
DEFAULT_SOURCE = "execution.batch.adaptive.auto-parallelism.default-source-parallelism"


# tailguard 1.0's decider: the optimal linear partition, broadcast bytes capped at 0.5·V.
OPTIMAL = {
    "decider.algorithm": "optimal",
    "execution.batch.adaptive.auto-parallelism.max-broadcast-ratio": "0.5",
}


class Sim(_Sim):
    def __post_init__(self) -> None:
        if self.decider is None:
            self.decider = ParallelismDecider(Settings(OPTIMAL))
        super().__post_init__()


def sub_ranges(d: r.SetParallelism | tuple[SubtaskInputs, ...], producer: str) -> list[tuple]:
    inputs = d.subtask_inputs if isinstance(d, r.SetParallelism) else d
    out = []
    for s in inputs:
        (rng,) = [i for i in s.inputs if i.input == producer]
        out.append((rng.subpartition_start, rng.subpartition_end))
    return out


def part_ranges(d: r.SetParallelism, producer: str) -> list[tuple]:
    out = []
    for s in d.subtask_inputs:
        (rng,) = [i for i in s.inputs if i.input == producer]
        out.append((rng.partition_start, rng.partition_end))
    return out


def two_stage(
    consumer_kw: dict | None = None, config: dict | None = None, producer_p: int = 2
) -> Sim:
    """Fixed producer A (parallelism `producer_p`) -ALL_TO_ALL-> adaptive B."""
    return Sim(
        [source("A", (1,) * producer_p, parallelism=producer_p), op("B", **(consumer_kw or {}))],
        [edge("A", "B", A2A)],
        config=config or {},
    )


def finish_all(sim: Sim, vertex: str, per_subtask: list[tuple[int, ...]]) -> list[r.Record]:
    out: list[r.Record] = []
    for k, sizes in enumerate(per_subtask):
        out += sim.finish(vertex, k, sizes)
    return out


# ----------------------------------------------------------------------------- FLIP-187 example


def test_flip187_count_based_subpartition_ranges_fig4():
    """FLIP-187 / the Flink 1.15 adaptive batch scheduler post, Fig. 4: A has parallelism 2, B's
    max parallelism is 4, so A1 and A2 each write 4 subpartitions. B at parallelism 2 reads
    [0,1] and [2,3]; at parallelism 3 it reads [0,0], [1,1] and [2,3] (B3 gets two)."""
    producers = {"A": (2, 4)}
    two = static_subtask_inputs(2, [("A", A2A)], producers, None)
    three = static_subtask_inputs(3, [("A", A2A)], producers, None)
    assert sub_ranges(two, "A") == [(0, 1), (2, 3)]
    assert sub_ranges(three, "A") == [(0, 0), (1, 1), (2, 3)]
    # Every subtask reads every producer partition (A1 and A2) for an ALL_TO_ALL edge.
    assert all(s.inputs[0].partition_start == 0 and s.inputs[0].partition_end == 1 for s in three)
    assert count_ranges(4, 3) == [(0, 0), (1, 1), (2, 3)]


def test_static_forward_pointwise_broadcast_rules():
    producers = {"F": (3, 1), "P": (6, 1), "B": (2, 1)}
    out = static_subtask_inputs(3, [("F", FWD), ("P", PW), ("B", BC)], producers, None)
    assert [s.inputs for s in out] == [
        (
            InputRange("F", k, k, 0, 0),
            InputRange("P", 2 * k, 2 * k + 1, 0, 0),
            InputRange("B", 0, 1, 0, 0),
        )
        for k in range(3)
    ]


def test_static_rejects_more_subtasks_than_a_pointwise_producer_has_partitions():
    with pytest.raises(ValueError):
        static_subtask_inputs(4, [("P", PW)], {"P": (3, 1)}, None)


def test_static_source_splits_balanced_by_bytes_and_surplus_subtasks_read_nothing():
    out = static_subtask_inputs(2, [], {}, (100, 1, 1, 1, 1))
    assert [s.inputs for s in out] == [
        (InputRange(SPLITS_INPUT, 0, 0, 0, 0),),
        (InputRange(SPLITS_INPUT, 1, 4, 0, 0),),
    ]
    out = static_subtask_inputs(3, [], {}, (5, 5))
    assert [len(s.inputs) for s in out] == [1, 1, 0]


# ----------------------------------------------------------------------------- the formula


def test_parallelism_is_ceil_of_bytes_over_volume_once_all_producer_subtasks_finished():
    sim = two_stage(config=vol(100))
    sim.submit()
    sim.initialize("A", 2)
    assert sim.finish("A", 0, (300,) + (0,) * 127) == []  # A1 still running: not yet
    out = sim.finish("A", 1, (0,) * 127 + (401,))
    (d,) = out
    assert isinstance(d, r.SetParallelism)
    assert d.vertex == "B" and d.parallelism == 8  # ceil(701 / 100)
    assert d.id == derived_id("decider", JOB, "B")
    assert d.caused_by == (sim.log[-2].id,) and d.ts == sim.log[-2].ts and d.job_id == JOB


def test_broadcast_bytes_are_capped_at_max_broadcast_ratio_of_v():
    def run(broadcast_bytes: int) -> int:
        sim = Sim(
            [source("A", (1,), parallelism=1), source("S", (1,), parallelism=1), op("J")],
            [edge("A", "J", A2A, 0), edge("S", "J", BC, 1)],
            config=vol(100),
        )
        sim.submit()
        sim.initialize("A", 1)
        sim.initialize("S", 1)
        sim.finish("S", 0, (broadcast_bytes,))
        (d,) = sim.finish("A", 0, (1000,) + (0,) * 127)
        return d.parallelism

    assert run(0) == 10  # 1000 / 100
    assert run(30) == 15  # ceil(1000 / 70)
    assert run(50) == 20  # 1000 / 50
    assert run(5000) == 20  # capped at 0.5·V: still 1000 / 50


def test_power_of_two_normalisation_is_optional():
    assert [closest_power_of_two(x) for x in (1, 2, 3, 5, 6, 7, 12, 64)] == [
        1,
        2,
        4,
        4,
        8,
        8,
        16,
        64,
    ]

    def run(config: dict) -> int:
        sim = two_stage(config={**vol(100), **config}, producer_p=1)
        sim.submit()
        sim.initialize("A", 1)
        (d,) = sim.finish("A", 0, (500,) + (0,) * 127)
        return d.parallelism

    assert run({}) == 5
    assert run({NORMALIZE: "true"}) == 4


@pytest.mark.parametrize(
    ("config", "consumer_kw", "nsub", "total", "expected"),
    [
        ({MINP: "4"}, {}, 128, 10, 4),  # small data: min-parallelism
        ({MAXP: "8"}, {}, 8, 10**6, 8),  # big data: max-parallelism
        ({}, {"max_parallelism": 3}, 128, 10**6, 3),  # the vertex's own max
        ({}, {}, 2, 10**6, 2),  # a producer that wrote only 2 subpartitions
        ({}, {}, 128, 0, 1),  # empty inputs still get one subtask
    ],
)
def test_parallelism_bounds(config, consumer_kw, nsub, total, expected):
    sim = two_stage(consumer_kw, config={**vol(100), **config}, producer_p=1)
    sim.submit()
    sim.initialize("A", 1)
    sizes = (total,) + (0,) * (nsub - 1)
    (d,) = sim.finish("A", 0, sizes)
    assert d.parallelism == expected
    assert [s.subtask for s in d.subtask_inputs] == list(range(expected))
    ranges = sub_ranges(d, "A")
    assert ranges[0][0] == 0 and ranges[-1][1] == nsub - 1


def test_pointwise_consumer_is_bounded_by_producer_partitions_and_balanced_by_bytes():
    sim = Sim([source("P", (1,) * 4, parallelism=4), op("C")], [edge("P", "C", PW)], vol(10))
    sim.submit()
    sim.initialize("P", 4)
    out = finish_all(sim, "P", [(90,), (10,), (10,), (10,)])
    (d,) = out
    assert d.parallelism == 4  # wanted 12, but only 4 partitions to hand out
    sim2 = Sim([source("P", (1,) * 4, parallelism=4), op("C")], [edge("P", "C", PW)], vol(50))
    sim2.submit()
    sim2.initialize("P", 4)
    (d2,) = finish_all(sim2, "P", [(90,), (10,), (10,), (10,)])
    assert d2.parallelism == 3  # ceil(120 / 50)
    assert part_ranges(d2, "P") == [(0, 0), (1, 2), (3, 3)]  # the heavy partition alone


def test_later_attempts_of_a_finished_subtask_are_ignored():
    sim = two_stage(config=vol(100), producer_p=2)
    sim.submit()
    sim.initialize("A", 2)
    sim.finish("A", 0, (100,) + (0,) * 127)
    assert sim.finish("A", 0, (10**9,) + (0,) * 127, attempt=1) == []  # a speculative loser
    (d,) = sim.finish("A", 1, (100,) + (0,) * 127)
    assert d.parallelism == 2


# ----------------------------------------------------------------------------- skew and joins


def test_a_subpartition_ten_times_the_others_gets_a_range_to_itself():
    weights = [10, 10, 10, 100, 10, 10, 10, 10]
    sim = two_stage(config=vol(80), producer_p=1)
    sim.submit()
    sim.initialize("A", 1)
    (d,) = sim.finish("A", 0, tuple(weights) + (0,) * 120)
    assert d.parallelism == 3  # ceil(170 / 80)
    ranges = sub_ranges(d, "A")
    assert (3, 3) in ranges
    # Count-based cutting (FLIP-187 as written) would put the heavy one with its neighbours.
    padded = weights + [0] * 120
    assert max(range_sums(padded, ranges)) == 100
    assert max(range_sums(padded, count_ranges(128, 3))) > 100


def test_balanced_ranges_are_optimal_on_a_known_case():
    # The optimum is 18: [7, 2, 5] | [10, 8]; moving the cut either way makes one side heavier.
    ranges = balanced_ranges([7, 2, 5, 10, 8], 2)
    assert max(range_sums([7, 2, 5, 10, 8], ranges)) == 18
    assert ranges == [(0, 2), (3, 4)]
    # All-zero sizes still come out count-balanced.
    assert balanced_ranges([0] * 6, 3) == [(0, 1), (2, 3), (4, 5)]


def test_join_inputs_get_the_same_subpartition_range_per_subtask():
    """Both sides are cut together, on the bytes of each subpartition index summed over both:
    the left side's heavy keys (at the front) and the right side's (at the back) each end up
    alone, which a cut on either side's bytes alone would not achieve."""
    sim = Sim(
        [source("L", (1, 1), parallelism=2), source("R", (1,), parallelism=1), op("J")],
        [edge("L", "J", A2A, 0), edge("R", "J", A2A, 1)],
        vol(100),
    )
    sim.submit()
    sim.initialize("L", 2)
    sim.initialize("R", 1)
    nsub = 128
    left = [tuple(150 if i < 4 else 0 for i in range(nsub)), tuple([0] * nsub)]
    right = tuple(200 if i >= 124 else 0 for i in range(nsub))
    finish_all(sim, "L", left)
    (d,) = sim.finish("R", 0, right)
    assert d.parallelism == 14  # ceil((600 + 800) / 100)
    assert sub_ranges(d, "L") == sub_ranges(d, "R")
    assert [s.inputs[0].input for s in d.subtask_inputs] == ["L"] * 14  # input order kept
    summed = [left[0][i] + right[i] for i in range(nsub)]
    assert max(range_sums(summed, sub_ranges(d, "L"))) == 200
    assert all(
        s.inputs[0].partition_end == 1 and s.inputs[1].partition_end == 0 for s in d.subtask_inputs
    )


# ----------------------------------------------------------------------------- forward groups


def test_forward_group_members_share_the_first_decision():
    sim = Sim(
        [source("S", (100,) * 6), op("M"), op("R")],
        [edge("S", "M", FWD), edge("M", "R", A2A)],
        vol(200),
    )
    (ds,) = sim.submit()
    assert ds.vertex == "S" and ds.parallelism == 3  # 600 bytes of splits / 200
    sim.initialize("S", 3)
    sim.finish("S", 0, (10**6,))
    assert sim.finish("S", 1, (1,)) == []
    (dm,) = sim.finish("S", 2, (1,))
    # M follows S whatever the bytes say, and reads S's partition i as subtask i.
    assert dm.vertex == "M" and dm.parallelism == 3
    assert part_ranges(dm, "S") == [(0, 0), (1, 1), (2, 2)]
    assert sim.decider.metrics()["forward_group_breaks"] == 0


def test_forward_group_with_a_fixed_member_takes_its_parallelism():
    sim = Sim(
        [source("S", (1,) * 8), op("M", parallelism=5)],
        [edge("S", "M", FWD)],
        vol(10**6),
    )
    (ds,) = sim.submit()
    assert ds.parallelism == 5  # not 1 (the bytes) but the group's fixed 5


def test_forward_group_member_that_cannot_follow_breaks_but_reads_everything_once():
    sim = Sim(
        [source("X", (1,) * 4, parallelism=4), source("Y", (1,) * 2, parallelism=2), op("J")],
        [edge("X", "J", FWD, 0), edge("Y", "J", PW, 1)],
        vol(1),
    )
    sim.submit()
    sim.initialize("X", 4)
    sim.initialize("Y", 2)
    finish_all(sim, "X", [(1,)] * 4)
    (d,) = finish_all(sim, "Y", [(1,)] * 2)
    assert d.parallelism == 2
    assert part_ranges(d, "X") == [(0, 1), (2, 3)]
    assert part_ranges(d, "Y") == [(0, 0), (1, 1)]
    assert sim.decider.metrics()["forward_group_breaks"] == 1


# ----------------------------------------------------------------------------- sources


@pytest.mark.parametrize(
    ("splits", "config", "expected", "ranges"),
    [
        ((10,) * 6, vol(25), 3, [(0, 1), (2, 3), (4, 5)]),
        ((10,) * 6, {**vol(25), DEFAULT_SOURCE: "2"}, 2, [(0, 2), (3, 5)]),
        ((10,) * 3, vol(1), 3, [(0, 0), (1, 1), (2, 2)]),  # at most one subtask per split
        ((100, 1, 1, 1, 1), vol(60), 2, [(0, 0), (1, 4)]),  # balanced by bytes
        ((0, 0), vol(60), 1, [(0, 1)]),  # empty splits: still one subtask
    ],
)
def test_sources_are_decided_from_their_splits_at_submission(splits, config, expected, ranges):
    sim = Sim([source("S", splits), op("M")], [edge("S", "M", A2A)], config)
    (d,) = sim.submit()
    assert d.vertex == "S" and d.parallelism == expected
    assert [
        (s.inputs[0].partition_start, s.inputs[0].partition_end) for s in d.subtask_inputs
    ] == ranges
    assert all(s.inputs[0].input == SPLITS_INPUT for s in d.subtask_inputs)


def test_fixed_vertices_and_sources_without_splits_are_not_decided():
    sim = Sim([source("S", (1, 2), parallelism=2), source("E", ())], [], {})
    assert sim.submit() == []
    assert sim.decider.metrics()["sources_without_splits"] == 1


# ----------------------------------------------------------------------------- robustness


def test_unknown_jobs_vertices_and_record_types_are_ignored_and_state_is_dropped():
    sim = two_stage(config=vol(100))
    decider = sim.decider
    stray = r.Tick(job_id="other", ts=1, id="other-e1")
    assert decider.handle(stray) == []
    sim.submit()
    assert sim.finish("nope", 0, (1,)) == []
    assert sim.initialize("nope", 3) == []
    assert sim.finish("A", 0, (1,)) == []  # A not initialised yet
    assert decider.metrics()["jobs_active"] == 1
    sim.feed(r.JobFinished, status=r.JobStatus.SUCCEEDED)
    assert decider.metrics()["jobs_active"] == 0
    assert sim.initialize("A", 2) == []


def test_a_bad_job_setting_falls_back_to_the_service_settings():
    sim = Sim(
        [source("S", (10,) * 4)],
        [],
        {MINP: "lots"},
        decider=ParallelismDecider(Settings(vol(20))),
    )
    (d,) = sim.submit()
    assert d.parallelism == 2  # the service's 20-byte volume, not a crash
    assert sim.decider.metrics()["config_errors"] == 1


def test_operator_settings_win_over_the_job_config():
    sim = Sim([source("S", (10,) * 4)], [], vol(40), decider=ParallelismDecider(Settings(vol(10))))
    (d,) = sim.submit()
    assert d.parallelism == 4


def test_metrics_count_decisions():
    sim = Sim(
        [source("S", (100,) * 4), op("M"), op("R")],
        [edge("S", "M", FWD), edge("M", "R", A2A)],
        vol(100),
    )
    sim.run(lambda name, nsub, k: (10,) * nsub)
    m = sim.decider.metrics()
    assert set(sim.decisions) == {"S", "M", "R"}
    assert m["decisions_emitted"] == 3
    assert m["sources_decided"] == 1 and m["vertices_decided"] == 1
    assert m["forward_group_followers"] == 1


def test_forward_group_whose_fixed_members_disagree_is_counted_and_still_read_once():
    sim = Sim(
        [source("S", (1, 1), parallelism=2), source("T", (1, 1, 1), parallelism=3), op("M")],
        [edge("S", "M", FWD, 0), edge("T", "M", FWD, 1)],
        vol(1),
    )
    assert sim.submit() == []
    assert sim.decider.metrics()["forward_group_breaks"] == 1
    sim.initialize("S", 2)
    sim.initialize("T", 3)
    finish_all(sim, "S", [(1,)] * 2)
    (d,) = finish_all(sim, "T", [(1,)] * 3)
    assert d.parallelism == 2  # the first fixed member's parallelism
    assert part_ranges(d, "S") == [(0, 0), (1, 1)]
    assert part_ranges(d, "T") == [(0, 1), (2, 2)]
