"""The agent's side of the adaptive broadcast join (agent/driver/broadcast_joins.py): which
side is produced first, which producer waits for the decision and until when, and what an
applied decision changes (the other side unshuffled, read in whole partitions, the broadcast
side built)."""

from __future__ import annotations

import pyarrow as pa

from tailguard.agent.driver.state import ExecutionState
from tailguard.agent.graph.api import Job
from tailguard.agent.graph.chaining import chain
from tailguard.decider.policy.broadcast_join import BroadcastJoinParams
from tailguard.model.records import Distribution, InputRange, SubtaskInputs

ON = BroadcastJoinParams(threshold=1000)
JOIN = "enrich→sink"


def _identity(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch


def _state(how: str = "left", params: BroadcastJoinParams = ON) -> ExecutionState:
    job = Job("j")
    large = job.read_parquet("large", name="large")
    small = job.read_parquet("dims", name="dims").map_batches(_identity, name="few")
    large.join(small, "k", how, name="enrich").write_parquet("out", name="sink")
    return ExecutionState(chain(job), 4, params)


def test_the_side_that_may_be_broadcast_is_produced_first_and_the_other_waits() -> None:
    left = _state("left").broadcast_joins.joins[JOIN]
    assert (left.first, left.held) == ("dims→few", "large")
    right = _state("right").broadcast_joins.joins[JOIN]
    assert (right.first, right.held) == ("large", "dims→few")
    joins = _state("left").broadcast_joins
    assert joins.holding("large", join_initialized=False, first_bytes=None)
    # The first side finished small: the decision is coming, keep waiting for it.
    assert joins.holding("large", join_initialized=False, first_bytes=999)
    # Too large for the rule: no decision before both sides are done, so produce it now.
    assert not joins.holding("large", join_initialized=False, first_bytes=1000)
    assert not joins.holding("large", join_initialized=True, first_bytes=None)
    assert not joins.holding("dims→few", join_initialized=False, first_bytes=None)


def test_a_full_join_or_the_rule_off_holds_nothing() -> None:
    assert _state("full").broadcast_joins.joins == {}
    off = BroadcastJoinParams(threshold=1000, strategy="none")
    assert _state("left", off).broadcast_joins.joins == {}
    assert not _state("left", off).held("large")


def test_a_side_feeding_two_joins_is_never_held() -> None:
    job = Job("j")
    a = job.read_parquet("a", name="a")
    b = job.read_parquet("b", name="b")
    a.join(b, "k", "left", name="j1").write_parquet("o1", name="s1")
    a.join(b, "k", "right", name="j2").write_parquet("o2", name="s2")
    joins = ExecutionState(chain(job), 4, ON).broadcast_joins
    # Both are joins the decider may broadcast; neither may hold a side: a is j2's first
    # side and b j1's, and each feeds two joins.
    assert set(joins.joins) == {"j1→s1", "j2→s2"}
    assert all(j.held is None for j in joins.joins.values())


def test_a_decision_before_the_other_side_started_has_it_write_one_unshuffled_subpartition() -> (
    None
):
    state = _state()
    assert state.output_distribution("large") == (Distribution.ALL_TO_ALL, ("k",))
    given = tuple(
        SubtaskInputs(k, (InputRange("large", k, k, 0, 0), InputRange("dims→few", 0, 0, 0, 3)))
        for k in range(2)
    )
    inputs = state.broadcast_join(JOIN, "dims→few", given)
    assert inputs == given
    assert state.output_distribution("large") == (Distribution.FORWARD, ())
    assert state.vertices["large"].subpartitions == 1
    (step,) = state.job.vertices[JOIN].steps
    built = state.broadcast_joins.step(JOIN, step)
    assert built.join is not None and built.join.build == "right"


def test_an_inner_join_broadcasting_its_left_side_builds_the_left_side() -> None:
    state = _state("inner")
    (step,) = state.job.vertices[JOIN].steps
    assert step.join is not None and step.join.build == "right"
    state.broadcast_join(JOIN, "large", ())
    built = state.broadcast_joins.step(JOIN, step)
    assert built.join is not None and built.join.build == "left"
