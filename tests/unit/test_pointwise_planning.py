"""Issue 11's agent side of Flink 2.1's POINTWISE computer, without a cluster: how many
subpartitions a producer writes for a POINTWISE consumer, a consumer reading a run of several
ranges of one input, the guard on such runs, per-vertex min parallelism from the job graph API
to the decider, and fixed vertices waiting for the decider's byte-balanced ranges."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import pytest
from decider_history import Sim, edge, op, source, vol

from tailguard.agent.driver import plans
from tailguard.agent.driver.commands import HANDLERS
from tailguard.agent.driver.state import Attempt, AttemptStatus, ExecutionState
from tailguard.agent.executor.attempt import AttemptOutcome
from tailguard.agent.executor.sources import Split
from tailguard.agent.executor.storage import Storage
from tailguard.agent.graph.api import Job, JobDefinitionError
from tailguard.agent.graph.chaining import chain
from tailguard.decider.policy.decider import waits_for_decider
from tailguard.decider.policy.flink import pointwise_subpartitions
from tailguard.model import records as r

SPLITS = [Split(f"in/{k}", None, 100) for k in range(3)]


def ident(t: Any) -> Any:
    return t


def rescale_job(consumer_parallelism: int | None = None, min_parallelism: int | None = None) -> Job:
    """src (3 splits) -rescale-> widen -> sink; widen adaptive unless given a parallelism."""
    job = Job("pw")
    src = job.read_parquet("in", name="src", parallelism=3)
    options: dict[str, int] = {}
    if consumer_parallelism is not None:
        options["parallelism"] = consumer_parallelism
    if min_parallelism is not None:
        options["min_parallelism"] = min_parallelism
    widened = src.rescale().map(ident, name="widen", **options)
    widened.write_parquet("out", name="sink")
    return job


def initialised_source(job: Job) -> ExecutionState:
    state = ExecutionState(chain(job), 8)
    inputs = plans.static_subtask_inputs(state, "src", SPLITS)
    assert inputs is not None
    state.initialize("src", 3, inputs, "fixed")
    return state


# ------------------------------------------------------------------ subpartitions per partition


def test_pointwise_subpartitions_are_the_fewest_that_reach_the_consumers_parallelism():
    """IntermediateResultPartition.computeNumberOfMaxPossiblePartitionConsumers (through Flink
    2.0): ceil(P / producers), so partitions x subpartitions >= P."""
    assert pointwise_subpartitions(8, 3) == 3
    assert pointwise_subpartitions(8, 2) == 4
    assert pointwise_subpartitions(128, 3) == 43  # the gcd rule would write 128
    assert pointwise_subpartitions(2, 5) == 1
    with pytest.raises(ValueError, match="consumer 0, producers 3"):
        pointwise_subpartitions(0, 3)


def test_a_producer_writes_subpartitions_for_its_pointwise_consumer_once_its_parallelism_is_known():
    state = ExecutionState(chain(rescale_job()), 8)
    assert state.vertices["src"].subpartitions == 1  # not initialised: nothing decided yet
    state = initialised_source(rescale_job())
    assert state.vertices["src"].subpartitions == 3  # ceil(max 8 / 3)
    # A fixed consumer needs no more than its own parallelism: ceil(4 / 3).
    assert (
        initialised_source(rescale_job(consumer_parallelism=4)).vertices["src"].subpartitions == 2
    )


# ------------------------------------------------------------------ a run of several ranges


def finish(state: ExecutionState, vertex: str, index: int, nsub: int) -> None:
    subtask = state.vertices[vertex].subtasks[index]
    attempt = Attempt(vertex, index, 0, "h1", False, None, 0)
    attempt.status = AttemptStatus.FINISHED
    attempt.outcome = AttemptOutcome(
        ok=True,
        host="h1",
        started_at_ms=0,
        finished_at_ms=1,
        input_bytes=10,
        records=1,
        bytes_per_subpartition=tuple(range(10, 10 + nsub)),
        checksums=tuple(f"c{index}.{sp}" for sp in range(nsub)),
    )
    subtask.attempts.append(attempt)
    subtask.winner = attempt
    subtask.available = True


RUN = (r.InputRange("src", 0, 0, 2, 2), r.InputRange("src", 1, 1, 0, 1))


def test_a_consumer_reads_a_run_across_partitions_as_one_input():
    state = initialised_source(rescale_job())
    for p in range(3):
        finish(state, "src", p, 3)
    consumer = next(name for name in state.vertices if name.startswith("widen"))
    state.initialize(consumer, 1, (r.SubtaskInputs(0, RUN),), "decider")
    spec = plans.task_spec(
        state, "job", Storage("/tmp/x"), state.vertices[consumer].subtasks[0], 0, {}, None
    )
    (plan,) = spec.inputs
    assert plan.ranges == RUN
    assert plan.attempts == {0: 0, 1: 0}
    assert plan.checksums == {(0, 2): "c0.2", (1, 0): "c1.0", (1, 1): "c1.1"}
    assert spec.input_bytes == 12 + 10 + 11  # the slices' bytes, for progress


def guard(state: ExecutionState, vertex: str, inputs: tuple[r.SubtaskInputs, ...]) -> str | None:
    command = r.SetParallelism(
        job_id="j",
        ts=0,
        id="c",
        caused_by=(),
        vertex=vertex,
        parallelism=len(inputs),
        subtask_inputs=inputs,
    )
    view = SimpleNamespace(state=state, split_counts={"src": 3})
    return HANDLERS[r.SetParallelism].guard(command, view)  # type: ignore[arg-type]


def test_the_guard_takes_a_run_of_ranges_for_a_pointwise_input_only():
    state = initialised_source(rescale_job())
    consumer = next(name for name in state.vertices if name.startswith("widen"))
    rest = (r.InputRange("src", 0, 0, 0, 1), r.InputRange("src", 1, 2, 2, 2))
    assert guard(state, consumer, (r.SubtaskInputs(0, RUN), r.SubtaskInputs(1, rest))) is None

    job = Job("a2a")
    src = job.read_parquet("in", name="src", parallelism=3)
    src.rebalance().map(ident, name="spread").write_parquet("out", name="sink")
    state = initialised_source(job)
    consumer = next(name for name in state.vertices if name.startswith("spread"))
    two = (r.InputRange("src", 0, 2, 0, 0), r.InputRange("src", 0, 2, 1, 1))
    problem = guard(state, consumer, (r.SubtaskInputs(0, two),))
    assert problem == "subtask 0: several ranges of non-POINTWISE input(s) ['src']"


# ------------------------------------------------------------------ fixed vertices wait


def test_a_fixed_vertex_with_blocking_edges_waits_for_the_deciders_ranges():
    state = initialised_source(rescale_job(consumer_parallelism=4))
    consumer = next(name for name in state.vertices if name.startswith("widen"))
    assert plans.static_subtask_inputs(state, consumer, None) is None
    # What it waits for: count-based ranges read whole partitions, 3 for 4 subtasks.
    with pytest.raises(ValueError, match=re.escape("parallelism 4 outside 1..3")):
        plans.static_subtask_inputs(state, consumer, None, wait_for_decider=False)


def test_a_fixed_vertex_its_inputs_cannot_feed_is_named_at_once_not_left_waiting():
    # FORWARD from 3 partitions into 5 fixed subtasks: no decider can give every one a range.
    job = Job("fwd")
    src = job.read_parquet("in", name="src", parallelism=3)
    src.map(ident, name="wide", parallelism=5).write_parquet("out", name="sink")
    state = initialised_source(job)
    with pytest.raises(ValueError, match=re.escape("parallelism 5 outside 1..3")):
        plans.static_subtask_inputs(state, "wide", None)


def test_only_vertices_with_blocking_edges_wait():
    blocking, pipelined = r.Exchange.BLOCKING, r.Exchange.PIPELINED
    assert waits_for_decider([blocking], [blocking])
    assert not waits_for_decider([], [blocking])  # a source: no input to size
    assert not waits_for_decider([pipelined], [])  # deployed with its producer
    assert not waits_for_decider([blocking], [pipelined])  # heads a pipelined region


# ------------------------------------------------------------------ min parallelism


def test_min_parallelism_goes_from_the_api_through_the_chain_into_the_submitted_graph():
    job = rescale_job(min_parallelism=5)
    spec = chain(job).spec()
    (widen,) = [v for v in spec.vertices if v.name.startswith("widen")]
    assert widen.min_parallelism == 5
    assert all(v.min_parallelism is None for v in spec.vertices if v is not widen)


def test_contradicting_bounds_are_named():
    job = Job("bad")
    src = job.read_parquet("in", name="src")
    with pytest.raises(JobDefinitionError, match="m: min_parallelism 9 is above max_parallelism 4"):
        src.map(ident, name="m", min_parallelism=9, max_parallelism=4)
    m = src.map(ident, name="m2", parallelism=2)
    with pytest.raises(
        JobDefinitionError, match="m2: parallelism 2 is below its min_parallelism 3"
    ):
        m.with_min_parallelism(3)
    assert job.vertices["m2"].min_parallelism is None  # the refused value is not kept
    with pytest.raises(
        JobDefinitionError, match="m3: parallelism 8 is above its max_parallelism 4"
    ):
        src.map(ident, name="m3", parallelism=8, max_parallelism=4)
    with pytest.raises(
        JobDefinitionError, match="min_parallelism must be a positive integer, got 0"
    ):
        m.with_min_parallelism(0)


def test_the_decider_raises_a_vertex_to_its_own_min_parallelism():
    """Flink 2.1's DefaultVertexParallelismAndInputInfosDecider takes the vertex's own min
    parallelism (`vertexMinParallelism`) over the global one."""
    for own, expected in ((None, 1), (4, 4)):
        sim = Sim(
            [source("A", (1,), parallelism=1), op("B", min_parallelism=own, max_parallelism=10)],
            [edge("A", "B", r.Distribution.ALL_TO_ALL)],
            config=vol(1 << 30),
        )
        sim.submit()
        sim.initialize("A", 1)
        (d,) = sim.finish("A", 0, (10,) * 10)
        assert isinstance(d, r.SetParallelism) and d.parallelism == expected
