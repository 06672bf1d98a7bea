"""A driver that takes over a job whose join was decided broadcast keeps what the decision did
beyond the join's own ranges (recorded in its `VertexInitialized`): the other side fused into the
join when it had not started, and the broadcast side as the join's build side. Without that, the
new driver would have the other side hash-split into the join's max-parallelism subpartitions
while the join reads subpartition 0 of each partition: rows lost, no error."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from agent_fakes import FakeRuntime, Harness, run_all
from test_agent_recovery import recovering
from test_broadcast_join_fused import expected_rows, join_job, output_rows

from tailguard.agent.driver.recovery import JobLog, RecoveryError, rebuild
from tailguard.agent.driver.state import ExecutionState
from tailguard.agent.executor.storage import Storage
from tailguard.agent.graph.api import Job
from tailguard.agent.graph.chaining import chain
from tailguard.decider.policy.broadcast_join import BroadcastJoinParams
from tailguard.model import records as r
from tailguard.model.config import Settings
from tailguard.model.records import Distribution

SETTINGS = {
    "table.optimizer.adaptive-broadcast-join.strategy": "auto",
    "execution.batch.adaptive.auto-parallelism.max-parallelism": "4",
}
JOIN = "enrich→sink"


def _crash_after_the_decision(tmp: Path) -> tuple[Job, list[r.Event], dict[str, r.Command]]:
    """Run the small side; the local fallback decides the join broadcast and releases the large
    side; the driver dies before any large attempt ends. Its events, its commands (the log's)
    and a copy of its storage (storage-at-crash) are what it leaves."""
    job = join_job(tmp)
    h = Harness(job, FakeRuntime.hosts(a=2), Storage(str(tmp / "storage")), settings=SETTINGS)
    h.start()
    ran = 0
    while not [e for e in h.publisher.of(r.VertexInitialized) if e.vertex == JOIN]:
        assert h.runtime.wait_deployed(ran + 1), "the small side never ran"
        d = h.runtime.deployed[ran]
        ran += 1
        assert d.key.vertex != "large", "the large side ran before the decision"
        h.post(h.runtime.execute(d.key))
    decided = [c for c in h.publisher.local_records if isinstance(c, r.SetParallelism)]
    assert any(c.broadcast is not None for c in decided), "no broadcast decision"
    events = [e for e in h.publisher.events if isinstance(e, r.Event)]
    commands = {c.id: c for c in h.publisher.local_records if isinstance(c, r.Command)}
    shutil.copytree(tmp / "storage", tmp / "storage-at-crash")
    h.stop()
    shutil.rmtree(tmp / "out", ignore_errors=True)
    return job, events, commands


def test_a_recovered_broadcast_join_reads_all_of_its_other_side(tmp_path: Path) -> None:
    job, events, commands = _crash_after_the_decision(tmp_path)
    storage = Storage(str(tmp_path / "storage-at-crash"))
    h = recovering(job, events, storage, SETTINGS, commands)
    result = run_all(h.start())
    assert result.ok, result.message
    # The large side ran under the new driver inside the join, as the decision had it ...
    assert not [e for e in h.publisher.of(r.AttemptDeploying) if e.vertex == "large"]
    assert result.fused == {"large": JOIN}
    # ... and the join read every row of it.
    assert output_rows(tmp_path) == expected_rows(tmp_path)


def test_the_rebuilt_state_has_the_decisions_effects(tmp_path: Path) -> None:
    job, events, commands = _crash_after_the_decision(tmp_path)
    params = BroadcastJoinParams.from_settings(Settings(SETTINGS))
    state = ExecutionState(chain(job), 4, params)
    rebuild(state, JobLog("job", tuple(events), commands, "the test's log"))
    assert state.output_distribution("large") == (Distribution.FORWARD, ())
    assert state.vertices["large"].subpartitions == 1
    assert state.fused("large")
    assert state.broadcast_joins.broadcast == {JOIN: "dims→few"}
    (step,) = [s for s in state.job.vertices[JOIN].steps if s.join is not None]
    assert state.broadcast_joins.step(JOIN, step).join.build == "right"  # type: ignore[union-attr]


def test_a_log_without_the_decision_is_refused(tmp_path: Path) -> None:
    job, events, _ = _crash_after_the_decision(tmp_path)
    params = BroadcastJoinParams.from_settings(Settings(SETTINGS))
    state = ExecutionState(chain(job), 4, params)
    with pytest.raises(RecoveryError, match="SetParallelism"):
        rebuild(state, JobLog("job", tuple(events), {}, "the test's log"))
