"""The adaptive broadcast join's decision (decider/policy/broadcast_join.py), pure: Flink's
`AdaptiveBroadcastJoinOptimizationStrategy` rules for each join type and side, the threshold,
the strategy, and the ranges; then the decider emitting it as a SetParallelism with its reason."""

from __future__ import annotations

import pytest
from decider_history import JOB, Sim, edge, op, source

from tailguard.decider.policy.broadcast_join import (
    STRATEGY_KEY,
    THRESHOLD_KEY,
    BroadcastJoinParams,
    Produced,
    broadcast_side,
    can_broadcast,
    decide_broadcast_join,
    first_side,
    other_side,
)
from tailguard.model import records as r
from tailguard.model.config import ConfigError, Settings
from tailguard.model.ids import derived_id
from tailguard.model.records import Distribution, InputRange

A2A = Distribution.ALL_TO_ALL
ON = BroadcastJoinParams(threshold=1000)
MAXP = "execution.batch.adaptive.auto-parallelism.max-parallelism"

# Flink's checkInputSideCanBeBroadcast: which side each join type may broadcast.
ALLOWED = {
    ("inner", "left"): True,
    ("inner", "right"): True,
    ("left", "left"): False,
    ("left", "right"): True,
    ("right", "left"): True,
    ("right", "right"): False,
    ("full", "left"): False,
    ("full", "right"): False,
    ("semi", "left"): False,
    ("semi", "right"): True,
    ("anti", "left"): False,
    ("anti", "right"): True,
}


@pytest.mark.parametrize(("how", "side"), sorted(ALLOWED))
def test_each_join_type_broadcasts_only_the_sides_flink_allows(how: str, side: str) -> None:
    assert can_broadcast(how, side, 999, ON) is ALLOWED[(how, side)]  # type: ignore[arg-type]
    # At or above the threshold never (Flink compares producedBytes < threshold).
    assert not can_broadcast(how, side, 1000, ON)  # type: ignore[arg-type]
    assert not can_broadcast(how, side, 5000, ON)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "params",
    [
        BroadcastJoinParams(threshold=1000, strategy="none"),
        BroadcastJoinParams(threshold=-1),
        BroadcastJoinParams(threshold=0),
    ],
)
def test_strategy_none_or_a_threshold_of_minus_one_turns_the_rule_off(
    params: BroadcastJoinParams,
) -> None:
    assert not params.enabled
    assert broadcast_side("inner", {"left": 1, "right": 1}, params) is None


def test_the_left_side_is_tried_first_as_flink_does() -> None:
    assert broadcast_side("inner", {"left": 10, "right": 5}, ON) == "left"
    assert broadcast_side("inner", {"left": 5000, "right": 5}, ON) == "right"
    assert broadcast_side("inner", {"right": 5}, ON) == "right"
    # A left join may not broadcast its small left side; its right is too large.
    assert broadcast_side("left", {"left": 1, "right": 5000}, ON) is None
    assert broadcast_side("full", {"left": 1, "right": 1}, ON) is None


def test_the_side_produced_first_is_one_the_join_type_may_broadcast() -> None:
    assert {how: first_side(how) for how in ("inner", "left", "right", "semi", "anti")} == {
        "inner": "right",
        "left": "right",
        "right": "left",
        "semi": "right",
        "anti": "right",
    }
    # Given what each side's sources read: an inner join starts with the smaller, right on a
    # tie; other types keep the only side they may broadcast.
    assert first_side("inner", (10, 20)) == "left"
    assert first_side("inner", (20, 10)) == "right"
    assert first_side("inner", (10, 10)) == "right"
    assert first_side("left", (10, 20)) == "right"
    assert first_side("right", (20, 10)) == "left"


def test_the_other_side_is_fused_only_when_unstarted_fed_to_one_join_and_reading_none() -> None:
    assert other_side(started=False, consumers=1, reads=False) == "fused"
    assert other_side(started=False, consumers=1, reads=True) == "unshuffled"
    assert other_side(started=True, consumers=1, reads=False) == "as written"
    assert other_side(started=False, consumers=2, reads=False) == "as written"


def test_settings_use_flinks_keys_and_defaults() -> None:
    params = BroadcastJoinParams.from_settings(Settings())
    assert params == BroadcastJoinParams(threshold=1024 * 1024, strategy="auto")
    assert BroadcastJoinParams.from_settings(Settings({THRESHOLD_KEY: "-1"})).threshold == -1
    runtime = BroadcastJoinParams.from_settings(Settings({STRATEGY_KEY: "RUNTIME_ONLY"}))
    assert runtime.strategy == "runtime_only" and runtime.enabled
    with pytest.raises(ConfigError, match=STRATEGY_KEY):
        BroadcastJoinParams.from_settings(Settings({STRATEGY_KEY: "always"}))
    with pytest.raises(ConfigError, match=THRESHOLD_KEY):
        BroadcastJoinParams.from_settings(Settings({THRESHOLD_KEY: "lots"}))


# ------------------------------------------------------------------------------- the ranges

JOIN = r.VertexSpec("j", r.VertexKind.OPERATOR, join="left")
EDGES = (edge("big", "j", A2A, 0), edge("small", "j", A2A, 1))


def test_one_subtask_per_partition_of_the_other_side_and_the_small_side_read_whole() -> None:
    produced = {
        "small": Produced(2, (300, 200), subpartitions=8, finished=True),
        "big": Produced(3),
    }
    decision = decide_broadcast_join(JOIN, EDGES, produced, 128, ON)
    assert decision is not None
    inputs, why = decision
    assert why == r.BroadcastJoin("small", "right", 500, 1000)
    assert [s.inputs for s in inputs] == [
        (InputRange("big", k, k, 0, 0), InputRange("small", 0, 1, 0, 7)) for k in range(3)
    ]


def test_rescaled_when_the_join_may_have_fewer_subtasks_than_the_other_side_has_partitions() -> (
    None
):
    produced = {"small": Produced(1, (5,), 4, finished=True), "big": Produced(5)}
    decision = decide_broadcast_join(JOIN, EDGES, produced, 2, ON)
    assert decision is not None
    ranges = [s.inputs[0] for s in decision[0]]
    assert [(x.partition_start, x.partition_end) for x in ranges] == [(0, 1), (2, 4)]


def test_a_finished_other_side_is_read_in_all_its_subpartitions() -> None:
    produced = {
        "small": Produced(1, (5,), 4, finished=True),
        "big": Produced(2, (9000, 9000), 4, finished=True),
    }
    decision = decide_broadcast_join(JOIN, EDGES, produced, 128, ON)
    assert decision is not None
    assert [s.inputs[0] for s in decision[0]] == [InputRange("big", k, k, 0, 3) for k in (0, 1)]


@pytest.mark.parametrize(
    ("vertex", "edges", "produced"),
    [
        # The other side is not initialised yet: decided when it is.
        (JOIN, EDGES, {"small": Produced(1, (5,), 4, finished=True)}),
        # The small side has not finished.
        (JOIN, EDGES, {"small": Produced(1, (5,), 4), "big": Produced(2)}),
        # A full join broadcasts neither side.
        (
            r.VertexSpec("j", r.VertexKind.OPERATOR, join="full"),
            EDGES,
            {"small": Produced(1, (5,), 4, finished=True), "big": Produced(2)},
        ),
        # A fixed parallelism is the user's: no rewrite.
        (
            r.VertexSpec("j", r.VertexKind.OPERATOR, join="left", parallelism=2),
            EDGES,
            {"small": Produced(1, (5,), 4, finished=True), "big": Produced(2)},
        ),
        # A side broadcast by the user already (Flink's isBroadcastJoin).
        (
            JOIN,
            (
                edge("big", "j", Distribution.FORWARD, 0),
                edge("small", "j", Distribution.BROADCAST, 1),
            ),
            {"small": Produced(1, (5,), 1, finished=True), "big": Produced(2)},
        ),
        # Not a join.
        (
            op("j"),
            EDGES,
            {"small": Produced(1, (5,), 4, finished=True), "big": Produced(2)},
        ),
    ],
)
def test_no_decision(
    vertex: r.VertexSpec, edges: tuple[r.EdgeSpec, ...], produced: dict[str, Produced]
) -> None:
    assert decide_broadcast_join(vertex, edges, produced, 128, ON) is None


# ------------------------------------------------------------------------------- the decider


def _join_job(how: str, config: dict[str, str] | None = None) -> Sim:
    return Sim(
        [
            source("big", (100, 100, 100)),
            source("small", (10,)),
            r.VertexSpec("j", r.VertexKind.OPERATOR, join=how),
        ],
        list(EDGES),
        config={MAXP: "4", **(config or {})},
    )


def test_the_decider_broadcasts_the_small_side_once_it_has_finished() -> None:
    sim = _join_job("left")
    sim.submit()
    sim.initialize("big", 3)
    sim.initialize("small", 1)
    out = sim.finish("small", 0, (100, 0, 50, 0))
    assert len(out) == 1
    decision = out[0]
    assert isinstance(decision, r.SetParallelism)
    assert decision.id == derived_id("decider", JOB, "j")
    assert decision.broadcast == r.BroadcastJoin("small", "right", 150, 1024 * 1024)
    assert decision.parallelism == 3
    # The big side finishing later decides nothing more: the join has its ranges.
    for k in range(3):
        assert sim.finish("big", k, (10, 10, 10, 10)) == []


def test_a_large_first_side_leaves_the_join_shuffled() -> None:
    sim = _join_job("left", {THRESHOLD_KEY: "100 b"})
    sim.submit()
    sim.initialize("big", 3)
    sim.initialize("small", 1)
    assert sim.finish("small", 0, (100, 0, 50, 0)) == []
    out: list[r.Record] = []
    for k in range(3):
        out += sim.finish("big", k, (10, 10, 10, 10))
    (decision,) = out
    assert isinstance(decision, r.SetParallelism) and decision.broadcast is None


def test_strategy_none_keeps_every_join_shuffled() -> None:
    sim = _join_job("inner", {STRATEGY_KEY: "none"})
    sim.submit()
    sim.initialize("big", 3)
    sim.initialize("small", 1)
    assert sim.finish("small", 0, (1, 0, 0, 0)) == []


def test_decided_when_the_other_side_is_initialised_after_the_small_one_finished() -> None:
    sim = _join_job("inner")
    sim.submit()
    sim.initialize("small", 1)
    assert sim.finish("small", 0, (1, 2, 3, 4)) == []
    (decision,) = sim.initialize("big", 2)
    assert isinstance(decision, r.SetParallelism) and decision.broadcast is not None
    assert decision.broadcast.side == "right" and decision.parallelism == 2
