"""Pipelined edges in the agent: job validation, region computation, bulk requests, the
speculation guard and the consumer's plan (FLIP-119)."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tailguard.agent.driver import plans
from tailguard.agent.driver.commands import HANDLERS
from tailguard.agent.driver.slots import ExecutionVertexId, RegionRequest, SlotPool
from tailguard.agent.driver.state import Attempt, ExecutionState, region_key, slot_requests
from tailguard.agent.executor.attempt import (
    AttemptOutcome,
    InputPlan,
    OutputPlan,
    TaskSpec,
    execute,
)
from tailguard.agent.executor.control import AttemptControl
from tailguard.agent.executor.partitions import read_subpartitions, write_partition
from tailguard.agent.executor.sources import Split
from tailguard.agent.executor.steps import OperatorStep
from tailguard.agent.executor.storage import Storage
from tailguard.agent.graph.api import Job, JobDefinitionError, pipelined_groups
from tailguard.agent.graph.chaining import chain
from tailguard.model import records as r


def ident(t: Any) -> Any:
    return t


def pipelined_job(source_p: int = 2, map_p: int = 2, all_to_all: bool = False) -> Job:
    """src -pipelined-> mid -blocking partition_by-> agg -> sink (agg and sink chain as
    "agg→sink"; a pipelined edge is never chained)."""
    job = Job("pipe")
    src = job.read_parquet("in", name="src", parallelism=source_p)
    edge = src.rebalance() if all_to_all else src
    mid = edge.pipelined().map(ident, name="mid", parallelism=map_p)
    agg = mid.partition_by("k").map(ident, name="agg", parallelism=1)
    agg.write_parquet("out", name="sink", parallelism=1)
    return job


SPLITS = [Split(f"in/{k}", None, 100) for k in range(4)]


def execution_state(job: Job) -> ExecutionState:
    return ExecutionState(chain(job), 8)


def initialise(state: ExecutionState) -> None:
    """Initialise every vertex as the driver does for fixed parallelisms."""
    for name in state.vertices:
        splits = SPLITS if name == "src" else None
        inputs = plans.static_subtask_inputs(state, name, splits, wait_for_decider=False)
        assert inputs is not None, name
        parallelism = state.vertices[name].definition.parallelism
        assert parallelism is not None
        state.initialize(name, parallelism, inputs, "fixed")


def finish(state: ExecutionState, vertex: str, index: int) -> Attempt:
    subtask = state.subtask(vertex, index)
    assert subtask is not None
    attempt = Attempt(vertex, index, subtask.next_number(), "h", False, None, 0)
    subtask.attempts.append(attempt)
    attempt.status = attempt.status.FINISHED
    attempt.outcome = AttemptOutcome(ok=True, host="h", started_at_ms=0, finished_at_ms=1)
    attempt.outcome.checksums = tuple(f"c{sp}" for sp in range(8))
    subtask.winner, subtask.available, subtask.wanted = attempt, True, False
    return attempt


# ---------------------------------------------------------------------- job definition


def test_pipelined_edge_needs_fixed_parallelism_on_both_ends() -> None:
    job = pipelined_job()
    job.vertices["mid"].parallelism = None
    with pytest.raises(JobDefinitionError, match="'mid' needs a fixed parallelism"):
        job.validate()
    job = pipelined_job()
    job.vertices["src"].parallelism = None
    with pytest.raises(JobDefinitionError, match="'src' needs a fixed parallelism"):
        job.validate()
    pipelined_job().validate()


def test_blocking_path_between_pipelined_vertices_is_rejected() -> None:
    job = Job("cycle")
    a = job.read_parquet("in", name="a", parallelism=1)
    b = a.map(ident, name="b", parallelism=1)  # blocking a -> b
    c = job.combine([a.pipelined(), b], lambda x, y: x, name="c", parallelism=1)
    c.write_parquet("out", name="sink")
    with pytest.raises(JobDefinitionError, match="blocking edge a -> b"):
        job.validate()


def test_pipelined_groups_are_the_connected_vertices() -> None:
    assert pipelined_groups(pipelined_job()) == [("src", "mid")]
    job = pipelined_job()
    job.vertices["mid"].inputs[0].exchange = r.Exchange.BLOCKING
    assert pipelined_groups(job) == []


# ---------------------------------------------------------------------- regions


def test_forward_pipelined_edge_pairs_subtasks_once_both_are_initialised() -> None:
    state = execution_state(pipelined_job())
    state.initialize(
        "src",
        2,
        plans.static_subtask_inputs(state, "src", SPLITS, wait_for_decider=False) or (),
        "fixed",
    )
    assert state.regions == {}  # mid is not initialised yet: no region known
    initialise_rest = plans.static_subtask_inputs(state, "mid", None, wait_for_decider=False)
    assert initialise_rest is not None
    state.initialize("mid", 2, initialise_rest, "fixed")
    assert state.region_of("src", 0) == (("src", 0), ("mid", 0))
    assert state.region_of("mid", 1) == (("src", 1), ("mid", 1))
    assert state.region_of("src", 0) != state.region_of("src", 1)


def test_all_to_all_pipelined_edge_makes_one_region_and_blocking_vertices_stay_alone() -> None:
    state = execution_state(pipelined_job(all_to_all=True))
    initialise(state)
    region = state.region_of("mid", 0)
    assert region is not None and set(region) == {("src", 0), ("src", 1), ("mid", 0), ("mid", 1)}
    assert region[:2] == (("src", 0), ("src", 1))  # producers first
    assert list(state.vertices) == ["src", "mid", "agg→sink"]
    assert state.region_of("agg→sink", 0) is None  # behind a blocking edge: alone


def test_pointwise_ranges_connect_a_consumer_to_its_producers() -> None:
    state = execution_state(pipelined_job(source_p=4, map_p=2))
    initialise(state)
    assert state.region_of("mid", 0) == (("src", 0), ("src", 1), ("mid", 0))
    assert state.region_of("mid", 1) == (("src", 2), ("src", 3), ("mid", 1))


# ---------------------------------------------------------------------- bulk requests


def test_a_region_is_requested_as_one_bulk_and_single_tasks_as_before() -> None:
    state = execution_state(pipelined_job())
    initialise(state)
    requests = slot_requests(state, set())
    assert [(q.key, q.tasks) for q in requests] == [
        (RegionRequest(ExecutionVertexId("src", 0)), [("src", 0), ("mid", 0)]),
        (RegionRequest(ExecutionVertexId("src", 1)), [("src", 1), ("mid", 1)]),
    ]
    assert all(isinstance(t, ExecutionVertexId) for q in requests for t in q.tasks)
    # Already queued: not again.
    assert slot_requests(state, {q.key for q in requests}) == []


def test_a_region_waits_for_its_blocking_inputs_and_running_tasks() -> None:
    job = pipelined_job()
    # agg -pipelined-> sink as a second region behind the blocking partition_by (a pipelined
    # edge is not chained: agg and sink stay two vertices).
    job.vertices["sink"].inputs[0].exchange = r.Exchange.PIPELINED
    state = execution_state(job)
    initialise(state)
    assert list(state.vertices) == ["src", "mid", "agg", "sink"]
    assert state.region_of("agg", 0) == (("agg", 0), ("sink", 0))
    keys = [q.key for q in slot_requests(state, set())]
    assert region_key((("agg", 0), ("sink", 0))) not in keys
    for k in range(2):
        finish(state, "src", k)
        finish(state, "mid", k)
    assert [q.tasks for q in slot_requests(state, set())] == [[("agg", 0), ("sink", 0)]]
    # A live attempt anywhere in the region holds the whole region back.
    sink = state.subtask("sink", 0)
    assert sink is not None
    sink.attempts.append(Attempt("sink", 0, 0, "h", False, None, 0))
    assert slot_requests(state, set()) == []


def test_a_task_redone_alone_reads_its_finished_partner() -> None:
    state = execution_state(pipelined_job())
    initialise(state)
    finish(state, "src", 0)
    mid = state.subtask("mid", 0)
    assert mid is not None and mid.wanted
    requests = slot_requests(state, set())
    assert requests[0].tasks == [("mid", 0)]


def test_bulk_waits_for_enough_free_slots_oldest_first() -> None:
    state = execution_state(pipelined_job())
    initialise(state)
    pool = SlotPool()
    pool.add_host("h", 3)
    for request in slot_requests(state, set()):
        pool.request(request)
    served = pool.assign(0)
    # 2 of 3 slots; 1 left, which region 1 must not take half of.
    assert [q.key for q, _ in served] == [RegionRequest(ExecutionVertexId("src", 0))]
    assert [q.key for q in pool.pending()] == [RegionRequest(ExecutionVertexId("src", 1))]
    (_, placed) = served[0]
    assert len({slot.slot_id for slot in placed.values()}) == 2
    pool.release(placed[ExecutionVertexId("src", 0)].slot_id)
    assert [q.key for q, _ in pool.assign(0)] == [RegionRequest(ExecutionVertexId("src", 1))]


# ---------------------------------------------------------------------- plans and commands


def test_consumer_plan_names_the_producer_attempt_deployed_with_it(tmp_path) -> None:
    state = execution_state(pipelined_job())
    initialise(state)
    mid = state.subtask("mid", 0)
    assert mid is not None
    spec = plans.task_spec(
        state,
        "job",
        Storage(str(tmp_path)),
        mid,
        0,
        {},
        None,
        together={ExecutionVertexId("src", 0): 3},
    )
    (plan,) = spec.inputs
    assert plan.pipelined and plan.attempts == {0: 3} and plan.checksums == {}
    finish(state, "src", 0)
    (blocking,) = plans.task_spec(state, "job", Storage(str(tmp_path)), mid, 0, {}, None).inputs
    assert not blocking.pipelined and blocking.attempts == {0: 0}
    assert blocking.checksums == {(0, 0): "c0"}


def test_speculation_in_a_multi_task_region_is_rejected() -> None:
    state = execution_state(pipelined_job())
    initialise(state)
    for vertex in ("src", "mid", "agg→sink"):
        subtask = state.subtask(vertex, 0)
        assert subtask is not None
        subtask.attempts.append(Attempt(vertex, 0, 0, "h", False, None, 0))
    view = SimpleNamespace(
        state=state, pool=SlotPool(), max_concurrent=4, split_counts={}, max_blocked_fraction=0.5
    )
    guard = HANDLERS[r.LaunchSpeculativeAttempts].guard

    def launch(vertex: str) -> r.LaunchSpeculativeAttempts:
        return r.LaunchSpeculativeAttempts(
            job_id="j", ts=1, id=f"c-{vertex}", vertex=vertex, subtask=0, count=1, avoid_hosts=()
        )

    for vertex in ("src", "mid"):
        reason = guard(launch(vertex), view)
        assert reason is not None and "pipelined region of 2 tasks" in reason
    assert guard(launch("agg→sink"), view) is None


# ---------------------------------------------------------------------- the consumer's read


def consumer_spec(storage: Storage) -> TaskSpec:
    plan = InputPlan((r.InputRange("src", 0, 0, 0, 0),), r.Distribution.FORWARD, {0: 4}, {}, True)
    return TaskSpec(
        job_id="job",
        storage=storage,
        vertex="mid",
        subtask=0,
        attempt=0,
        steps=(OperatorStep("mid", lambda t: t.append_column("y", pc.multiply(t["x"], 2))),),
        inputs=(plan,),
        output=OutputPlan(r.Distribution.FORWARD, (), 1),
    )


def test_pipelined_consumer_waits_for_the_producer_then_verifies_its_checksums(tmp_path) -> None:
    storage = Storage(str(tmp_path))
    spec = consumer_spec(storage)
    outcomes: list[AttemptOutcome] = []
    consumer = threading.Thread(target=lambda: outcomes.append(execute(spec)))
    consumer.start()
    consumer.join(0.2)
    assert consumer.is_alive()  # nothing to read yet
    write_partition(storage, "job", r.PartitionRef("src", 0, 4), [pa.table({"x": [1, 2, 3]})])
    consumer.join(10)
    (outcome,) = outcomes
    assert outcome.ok, outcome.message
    assert outcome.records == 3
    got, _ = read_subpartitions(
        storage, "job", "mid", {0: 0}, (0, 0), (0, 0), {(0, 0): outcome.checksums[0]}
    )
    assert got.column("y").to_pylist() == [2, 4, 6]


def test_pipelined_consumer_stops_waiting_when_it_is_cancelled(tmp_path) -> None:
    """A producer that fails restarts its region, which cancels the consumer waiting for it:
    the wait ends with a cancelled outcome, not a missing partition to recover."""
    storage = Storage(str(tmp_path))
    spec = consumer_spec(storage)
    control = AttemptControl()
    outcomes: list[AttemptOutcome] = []
    consumer = threading.Thread(target=lambda: outcomes.append(execute(spec, control)))
    consumer.start()
    consumer.join(0.2)
    assert consumer.is_alive()  # waiting for src#0 attempt 4
    control.cancel()
    consumer.join(10)
    (outcome,) = outcomes
    assert not outcome.ok and outcome.cancelled
    assert outcome.missing_partition is None  # nothing for the failover to act on
    # The cancelled consumer wrote nothing.
    assert not storage.exists(storage.path("job", "partitions", "mid"))


def test_pipelined_consumer_of_a_producer_that_never_writes_times_out_as_missing(
    tmp_path, monkeypatch
) -> None:
    from tailguard.agent.executor import attempt as attempt_module

    monkeypatch.setattr(attempt_module, "PIPELINED_WAIT_S", 0.0)
    outcome = execute(consumer_spec(Storage(str(tmp_path))))
    assert not outcome.ok and outcome.error is r.ErrorKind.PARTITION_MISSING
    assert outcome.missing_partition == r.PartitionRef("src", 0, 4)
