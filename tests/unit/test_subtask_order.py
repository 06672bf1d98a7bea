"""The agent's subtask order (`scheduler.subtask-order`, agent/driver/ordering.py): index order
by default, largest assigned input first on request, from the bytes the agent knows."""

from __future__ import annotations

from typing import Any

import pytest

from tailguard.agent.driver import plans
from tailguard.agent.driver.ordering import (
    SubtaskOrder,
    order_requests,
    ordered,
    subtask_order,
)
from tailguard.agent.driver.slots import ExecutionVertexId
from tailguard.agent.driver.state import Attempt, ExecutionState, slot_requests
from tailguard.agent.executor.attempt import AttemptOutcome
from tailguard.agent.executor.sources import Split
from tailguard.agent.graph.api import Job
from tailguard.agent.graph.chaining import chain
from tailguard.model.config import ConfigError, Settings

LARGEST = SubtaskOrder.LARGEST_INPUT_FIRST


def ident(t: Any) -> Any:
    return t


def test_index_order_is_the_default_and_largest_first_is_opt_in() -> None:
    assert subtask_order(Settings()) is SubtaskOrder.INDEX
    chosen = Settings({"scheduler.subtask-order": "largest-input-first"})
    assert subtask_order(chosen) is LARGEST


def test_an_unknown_order_is_refused_naming_the_setting_and_the_known_values() -> None:
    with pytest.raises(ConfigError, match=r"scheduler.subtask-order.*'biggest'.*index"):
        subtask_order(Settings({"scheduler.subtask-order": "biggest"}))


def test_largest_first_ranks_by_bytes_ties_by_index_unknown_last() -> None:
    sizes = {0: 10, 1: None, 2: 50, 3: 10, 4: 70, 5: None}
    items = list(sizes)
    assert ordered(items, sizes.get, SubtaskOrder.INDEX) == items
    assert ordered(items, sizes.get, LARGEST) == [4, 2, 0, 3, 1, 5]


# ---------------------------------------------------------------------- in the driver's terms

SPLIT_BYTES = (100, 900, 300, 500)


def blocking_job() -> Job:
    """src (4 splits) -> a POINTWISE-read consumer of parallelism 2 -> sink."""
    job = Job("order")
    src = job.read_parquet("in", name="src", parallelism=4)
    mid = src.partition_by("k").map(ident, name="mid", parallelism=2)
    mid.write_parquet("out", name="sink", parallelism=2)
    return job


def initialised(job: Job) -> tuple[ExecutionState, dict[str, list[Split]]]:
    state = ExecutionState(chain(job), 8)
    splits = {}
    for name, vertex in state.vertices.items():
        if vertex.definition.source is not None:
            splits[name] = [Split(f"in/{k}", None, b) for k, b in enumerate(SPLIT_BYTES)]
    for name in list(state.vertices)[:1]:
        inputs = plans.static_subtask_inputs(state, name, splits.get(name), wait_for_decider=False)
        assert inputs is not None
        state.initialize(name, len(SPLIT_BYTES), inputs, "fixed")
    return state, splits


def fresh_order(
    state: ExecutionState, splits: dict[str, list[Split]], order: SubtaskOrder
) -> list[tuple[str, int]]:
    requests = order_requests(
        slot_requests(state, set()),
        lambda task: plans.subtask_input_bytes(state, task, splits),
        order,
    )
    return [tuple(task) for q in requests for task in q.tasks]  # type: ignore[misc]


def test_a_source_starts_its_largest_splits_first() -> None:
    state, splits = initialised(blocking_job())
    source = next(iter(state.vertices))
    assert fresh_order(state, splits, SubtaskOrder.INDEX) == [(source, k) for k in range(4)]
    # Without the ordering the driver would deploy 0, 1, 2, 3: the 900-byte split second.
    assert fresh_order(state, splits, LARGEST) == [(source, k) for k in (1, 3, 2, 0)]


def test_a_consumer_is_ranked_by_the_producer_bytes_of_its_assigned_ranges() -> None:
    state, splits = initialised(blocking_job())
    source, consumer = list(state.vertices)[:2]
    # Each producer subtask writes 2 subpartitions; consumer k reads subpartition k of all.
    for index in range(4):
        subtask = state.subtask(source, index)
        assert subtask is not None
        attempt = Attempt(source, index, 0, "h", False, None, 0)
        attempt.outcome = AttemptOutcome(
            ok=True,
            host="h",
            started_at_ms=0,
            finished_at_ms=1,
            bytes_per_subpartition=(10,) * 4 + (40,) * 4,
            checksums=tuple(f"c{sp}" for sp in range(8)),
        )
        subtask.attempts.append(attempt)
        subtask.winner, subtask.available, subtask.wanted = attempt, True, False
    inputs = plans.static_subtask_inputs(state, consumer, None, wait_for_decider=False)
    assert inputs is not None
    state.initialize(consumer, 2, inputs, "fixed")
    assert plans.subtask_input_bytes(state, ExecutionVertexId(consumer, 0), {}) == 160
    assert plans.subtask_input_bytes(state, ExecutionVertexId(consumer, 1), {}) == 640
    assert fresh_order(state, splits, SubtaskOrder.INDEX) == [(consumer, 0), (consumer, 1)]
    assert fresh_order(state, splits, LARGEST) == [(consumer, 1), (consumer, 0)]
