"""The driver's scheduling of pipelined regions, with a fake runtime (no Spark) whose runners the
test answers: bulk placement on free slots only, producers first, FIFO between regions, and a
region restart re-requested as one bulk (FLIP-119)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from agent_fakes import FakeRuntime, Harness, cancelled_outcome, failed_outcome, write_parquet_input

from tailguard.agent.driver.slots import ExecutionVertexId, RegionRequest
from tailguard.agent.executor.storage import Storage
from tailguard.agent.graph.api import Job
from tailguard.model import records as r

Key = tuple[str, int, int]


def ident(t: Any) -> Any:
    return t


@pytest.fixture
def harness(tmp_path: Path):
    """sales (2, blocking) -> score (2) -pipelined-> partial (2) -> final (1) -> sink (1):
    regions {score#k, partial#k} of 2 tasks, on one host with 2 slots."""
    job = Job("regions")
    sales = job.read_parquet(str(write_parquet_input(tmp_path / "in.parquet")), name="sales")
    sales = sales.with_parallelism(2)
    # A chain of its own, so the region sits behind a blocking edge as a separate vertex.
    score = sales.map(ident, name="score", parallelism=2).start_new_chain()
    partial = score.pipelined().map(ident, name="partial", parallelism=2)
    final = partial.partition_by("region").map(ident, name="final", parallelism=1)
    final.write_parquet(str(tmp_path / "out"), name="sink", parallelism=1)
    h = Harness(
        job,
        FakeRuntime.hosts(h=2),
        Storage(str(tmp_path / "storage")),
        services=False,
        settings={
            "restart-strategy.type": "fixed-delay",
            "restart-strategy.fixed-delay.delay": "0 ms",
        },
    )
    assert list(h.driver.graph.vertices) == ["sales", "score", "partial", "final→sink"]
    h.start()
    yield h
    h.stop()


def deployed_by(h: Harness, action: Any) -> list[Key]:
    """The attempts deployed while the driver handled `action`."""
    before = len(h.runtime.deployed)
    action()
    return h.runtime.keys(before)


def test_regions_are_placed_whole_on_free_slots_oldest_first(harness: Harness) -> None:
    h = harness
    assert h.runtime.keys() == [("sales", 0, 0), ("sales", 1, 0)]
    assert deployed_by(h, lambda: h.finish(("sales", 0, 0))) == []
    # Region {score#0, partial#0} is ready but only one slot is free: nothing runs half of it.
    assert [q.key for q in h.driver.pool.pending()] == [
        RegionRequest(ExecutionVertexId("score", 0))
    ]
    assert deployed_by(h, lambda: h.finish(("sales", 1, 0))) == [
        ("score", 0, 0),
        ("partial", 0, 0),
    ]
    # Region 1 still needs 2 slots at once.
    assert deployed_by(h, lambda: h.finish(("score", 0, 0))) == []
    assert deployed_by(h, lambda: h.finish(("partial", 0, 0))) == [
        ("score", 1, 0),
        ("partial", 1, 0),
    ]

    # The consumer names the producer attempt deployed with it and awaits its checksums.
    (plan,) = h.runtime.of(("partial", 1, 0)).spec.inputs
    assert plan.pipelined and plan.attempts == {1: 0} and plan.checksums == {}
    deploying = h.publisher.of(r.AttemptDeploying)
    assert [(e.vertex, e.subtask) for e in deploying][-2:] == [("score", 1), ("partial", 1)]
    # Producer first, on distinct slots.
    slots = {h.runtime.of(k).slot for k in (("score", 1, 0), ("partial", 1, 0))}
    assert slots == {"h/s0", "h/s1"}


def test_a_failure_in_a_region_restarts_it_as_one_bulk(harness: Harness) -> None:
    h = harness
    h.finish(("sales", 0, 0))
    assert deployed_by(h, lambda: h.finish(("sales", 1, 0))) == [
        ("score", 0, 0),
        ("partial", 0, 0),
    ]
    h.finish(("score", 0, 0))
    # The local failover (services off) restarts the region, the finished producer too; the
    # region is requested again as one bulk, behind region 1, which asked first.
    assert deployed_by(h, lambda: h.end(("partial", 0, 0), failed_outcome())) == [
        ("score", 1, 0),
        ("partial", 1, 0),
    ]
    applied = h.publisher.of(r.CommandApplied)
    assert [c.command_type for c in applied] == ["RestartTasks"]
    restart = h.publisher.local_records[-1]
    assert isinstance(restart, r.RestartTasks)
    assert set(restart.tasks) == {r.TaskRef("score", 0), r.TaskRef("partial", 0)}
    score0 = h.driver.state.subtask("score", 0)
    assert score0 is not None and score0.winner is None
    assert [q.tasks for q in h.driver.pool.pending()] == [[("score", 0), ("partial", 0)]]
    h.finish(("score", 1, 0))
    assert deployed_by(h, lambda: h.finish(("partial", 1, 0))) == [
        ("score", 0, 1),
        ("partial", 0, 1),
    ]


def test_a_failed_producer_cancels_its_live_consumer_and_the_region_waits_for_its_slot(
    harness: Harness,
) -> None:
    h = harness
    h.finish(("sales", 0, 0))
    h.finish(("sales", 1, 0))
    assert h.runtime.keys(2) == [("score", 0, 0), ("partial", 0, 0)]
    # The restart cancels the consumer still waiting for its producer; its slot comes back only
    # when its runner reports the attempt's end, so no region (region 1 asked first) can be
    # placed whole yet.
    assert deployed_by(h, lambda: h.end(("score", 0, 0), failed_outcome())) == []
    partial_slot = h.runtime.of(("partial", 0, 0)).slot
    assert [(s, (k.vertex, k.subtask, k.attempt)) for s, k in h.runtime.cancelled] == [
        (partial_slot, ("partial", 0, 0))
    ]
    canceled = h.publisher.of(r.AttemptCanceled)
    assert [(e.vertex, e.reason) for e in canceled] == [("partial", r.CancelReason.RESTART)]
    assert deployed_by(h, lambda: h.end(("partial", 0, 0), cancelled_outcome())) == [
        ("score", 1, 0),
        ("partial", 1, 0),
    ]
    # The cancelled attempt's end is not a failure: no second restart.
    assert len(h.publisher.of(r.AttemptFailed)) == 1
    assert [c.command_type for c in h.publisher.of(r.CommandApplied)] == ["RestartTasks"]
