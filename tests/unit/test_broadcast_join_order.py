"""The agent's side of the adaptive broadcast join (agent/driver/broadcast_joins.py): which
side is produced first, which producer waits for the decision and until when, and what an
applied decision changes (the other side fused into the join, or unshuffled when it runs in a
pipelined region, read in whole partitions; the broadcast side built), and what a join subtask
with a fused producer is sent."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from test_agent_regions import finish

from tailguard.agent.driver import plans
from tailguard.agent.driver.slots import ExecutionVertexId
from tailguard.agent.driver.state import ExecutionState, slot_requests
from tailguard.agent.executor.sources import Split
from tailguard.agent.executor.storage import Storage
from tailguard.agent.graph.api import Job
from tailguard.agent.graph.chaining import chain
from tailguard.decider.policy.broadcast_join import BroadcastJoinParams
from tailguard.model.records import SPLITS_INPUT, Distribution, InputRange, SubtaskInputs

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


def _large_splits(count: int) -> list[Split]:
    return [Split(f"/large/part-{n}.parquet", 0, 100 * (n + 1)) for n in range(count)]


def _initialise(state: ExecutionState, name: str, parallelism: int, source: bool) -> None:
    """`name` initialised with `parallelism` subtasks, each reading its own split (a source) or
    all of the previous vertex's subpartitions."""
    inputs = tuple(
        SubtaskInputs(k, (InputRange(SPLITS_INPUT, k, k, 0, 0),) if source else ())
        for k in range(parallelism)
    )
    state.initialize(name, parallelism, inputs, "test")


def _decided(state: ExecutionState) -> tuple[SubtaskInputs, ...]:
    """The small side finished, and the join decided broadcast over the large side's two
    partitions (its subtask 0 reading both)."""
    _initialise(state, "large", 2, source=True)
    _initialise(state, "dims→few", 1, source=True)
    outcome = finish(state, "dims→few", 0).outcome
    assert outcome is not None
    outcome.bytes_per_subpartition = (1, 2, 3, 1)
    given = (
        SubtaskInputs(0, (InputRange("large", 0, 1, 0, 0), InputRange("dims→few", 0, 0, 0, 3))),
    )
    inputs = state.broadcast_join(JOIN, "dims→few", given)
    state.initialize(JOIN, 1, inputs, "test")
    return inputs


def test_a_decision_before_the_other_side_started_fuses_it_into_the_join(tmp_path: Path) -> None:
    state = _state()
    assert state.output_distribution("large") == (Distribution.ALL_TO_ALL, ("k",))
    inputs = _decided(state)
    assert inputs[0].inputs[0] == InputRange("large", 0, 1, 0, 0)
    assert state.fused("large") and state.broadcast_joins.fused == {"large": JOIN}
    assert state.output_distribution("large") == (Distribution.FORWARD, ())
    assert state.vertices["large"].subpartitions == 1
    (step,) = state.job.vertices[JOIN].steps
    built = state.broadcast_joins.step(JOIN, step)
    assert built.join is not None and built.join.build == "right"
    # Never deployed on its own; its join is, at once (a source's splits are always there).
    requested = [tuple(t) for q in slot_requests(state, set()) for t in q.tasks]
    assert requested == [(JOIN, 0)]
    # The join's subtask runs both large partitions' chains, each with its own split.
    splits = {"large": _large_splits(2)}
    join = state.vertices[JOIN].subtasks[0]
    spec = plans.task_spec(state, "job", Storage(str(tmp_path)), join, 3, splits, None)
    fused, small = spec.inputs
    assert (fused.attempts, fused.checksums) == ({}, {})
    assert [(c.vertex, c.subtask, c.attempt, c.splits) for c in fused.fused] == [
        ("large", 0, 3, (splits["large"][0],)),
        ("large", 1, 3, (splits["large"][1],)),
    ]
    assert all(c.output is None and c.sink is None for c in fused.fused)
    # Without the fused source's splits the join would read nothing of it: refused instead.
    with pytest.raises(RuntimeError, match="large: a source needs its splits"):
        plans.task_spec(state, "job", Storage(str(tmp_path)), join, 3, {}, None)
    assert not small.fused and small.attempts == {0: 0}
    # Its bytes: the large side's splits and what the small side wrote.
    assert spec.input_bytes == 100 + 200 + 7
    assert plans.subtask_input_bytes(state, ExecutionVertexId(JOIN, 0), splits) == 307
    # Done once the join is: the fused vertex has nothing of its own to finish.
    assert not state.all_done()
    finish(state, JOIN, 0)
    join.committed = True
    assert state.all_done()
    assert state.counts() == (2, 2)


@pytest.mark.parametrize("exchange", ["pipelined", "shuffled"])
def test_an_other_side_reading_another_producer_is_written_unshuffled_instead(
    exchange: str,
) -> None:
    """Not fused: the failover and a takeover would not see what the join read through it."""
    job = Job("j")
    large = job.read_parquet("large", name="large").with_parallelism(2)
    edge = large.pipelined() if exchange == "pipelined" else large.partition_by("k")
    mid = edge.map_batches(_identity, name="mid").with_parallelism(2)
    small = job.read_parquet("dims", name="dims").map_batches(_identity, name="few")
    mid.join(small, "k", "left", name="enrich").write_parquet("out", name="sink")
    state = ExecutionState(chain(job), 4, ON)
    assert state.broadcast_joins.joins[JOIN].held == "mid"
    state.broadcast_join(JOIN, "dims→few", ())
    assert not state.fused("mid")
    assert state.broadcast_joins.unshuffled == {"mid"}
    assert state.output_distribution("mid") == (Distribution.FORWARD, ())
    assert state.vertices["mid"].subpartitions == 1


def test_an_inner_join_broadcasting_its_left_side_builds_the_left_side() -> None:
    state = _state("inner")
    (step,) = state.job.vertices[JOIN].steps
    assert step.join is not None and step.join.build == "right"
    state.broadcast_join(JOIN, "large", ())
    built = state.broadcast_joins.step(JOIN, step)
    assert built.join is not None and built.join.build == "left"
