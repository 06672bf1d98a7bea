"""Driver recovery on the fake runtime: a driver is abandoned mid-job (its events and its
storage as they were), a new one takes over from its log and finishes the job exactly, re-running
only what was running or lost; a job that cannot be recovered is refused before anything is
recorded. (The kill -9 of a real driver: tests/integration/test_driver_recovery.py.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from agent_fakes import QUIET, FakeRuntime, Harness, failed_outcome, run_all
from test_agent_driver import FAST_RESTART, expected_totals, output_totals, sales_job

from tailguard.agent.driver.driver import JobDriver, RunOptions
from tailguard.agent.driver.recovery import JobLog, RecoveryError, rebuild
from tailguard.agent.driver.state import ExecutionState
from tailguard.agent.executor import partitions
from tailguard.agent.executor.storage import Storage
from tailguard.agent.graph.api import Job
from tailguard.agent.graph.chaining import chain
from tailguard.model import records as r
from tailguard.model.config import Settings
from tailguard.replay.engine import Recorded, replay
from tailguard.system.services import SERVICES

P = "sales→score→partial"
F = "final→out"


def crash_mid_job(tmp_path: Path) -> tuple[Job, list[r.Event], Storage]:
    """Run the sales job until both partials and final#0 finished, final#1 runs and final#2
    waits for a slot; then 'kill' the driver: keep its events and a copy of its storage."""
    job, events, _, storage = crash_with_decisions(tmp_path)
    return job, events, storage


def crash_with_decisions(tmp_path: Path) -> tuple[Job, list[r.Event], list[r.Record], Storage]:
    """`crash_mid_job`, with the decisions the dead driver took locally (its log's commands)."""
    job = sales_job(tmp_path, final_parallelism=3)
    h = Harness(job, FakeRuntime.hosts(a=2), Storage(str(tmp_path / "storage"))).start()
    h.post(h.runtime.execute((P, 0, 0)))
    h.post(h.runtime.execute((P, 1, 0)))
    h.post(h.runtime.execute((F, 0, 0)))
    deployed = h.runtime.keys()
    assert (F, 1, 0) in deployed and (F, 2, 0) in deployed
    h.post(h.runtime.execute((F, 2, 0)))  # final#1 is the one running at the crash
    events = [e for e in h.publisher.events if isinstance(e, r.Event)]
    shutil.copytree(tmp_path / "storage", tmp_path / "storage-at-crash")
    h.stop()  # (its cleanup only touches the original storage)
    return job, events, h.publisher.local_records, Storage(str(tmp_path / "storage-at-crash"))


def recovering(
    job: Job,
    events: list[r.Event],
    storage: Storage,
    settings: dict[str, str] | None = None,
    commands: dict[str, r.Command] | None = None,
) -> Harness:
    """A driver taking the job over from `events` (and the log's `commands`), not started."""
    h = Harness(job, FakeRuntime.hosts(a=2), storage)
    h.driver = JobDriver(
        job,
        h.runtime,
        h.publisher,
        Settings({**QUIET, **(settings or {})}),
        RunOptions(services=False, storage=storage, progress=False),
        job_id="job",
        inbox=h.inbox,
        recover=JobLog("job", tuple(events), commands or {}, "the test's log"),
    )
    return h


def test_a_recovered_job_finishes_exactly_running_only_what_was_lost(tmp_path: Path) -> None:
    job, events, storage = crash_mid_job(tmp_path)
    h = recovering(job, events, storage)
    result = run_all(h.start())
    assert result.ok, result.message
    assert output_totals(tmp_path) == expected_totals(tmp_path)
    # Only final#1 ran again (as attempt 1); nothing finished before was redeployed.
    assert h.runtime.keys() == [(F, 1, 1)]
    assert result.recovery is not None
    assert (result.recovery.kept_results, result.recovery.lost_attempts) == (4, 1)
    assert (result.recovery.lost_results, result.recovery.attempts_after) == (0, 1)
    new = h.publisher.events
    # The takeover is the first thing in the log: which run it replaces, where that one
    # stopped, and what was kept, reset and lost.
    marker = new[0]
    assert marker == r.JobRecovered(
        job_id="job",
        ts=marker.ts,
        id=f"job-e{len(events) + 1}",
        replaced_run="job-e1",
        last_sequence=len(events),
        last_event_ts=events[-1].ts,
        log_source="the test's log",
        reset_attempts=(r.AttemptRef(F, 1, 0),),
        kept_results=(r.PartitionRef(P, 0, 0), r.PartitionRef(P, 1, 0)),
        kept_sink_parts=(r.TaskRef(F, 0), r.TaskRef(F, 2)),
        lost_results=(),
        commands_handled=len([e for e in events if isinstance(e, r.CommandApplied)]),
    )
    assert marker.commands_handled >= 1
    # Then the lost attempt is ended for the services; the sequence goes on without a gap.
    first = new[1]
    assert isinstance(first, r.AttemptCanceled)
    assert (first.vertex, first.subtask, first.attempt, first.reason) == (
        F,
        1,
        0,
        r.CancelReason.RESTART,
    )
    ids = [e.id for e in [*events, *new] if isinstance(e, r.Event)]
    assert ids == [f"job-e{n}" for n in range(1, len(ids) + 1)]
    assert not [e for e in new if isinstance(e, r.JobSubmitted | r.VertexInitialized)]


def test_a_lost_partition_still_needed_is_produced_again(tmp_path: Path) -> None:
    job, events, storage = crash_mid_job(tmp_path)
    damaged = partitions.subpartition_path(storage, "job", r.PartitionRef(P, 1, 0), 0)
    Path(damaged).write_bytes(b"not what was written")
    h = recovering(job, events, storage)
    result = run_all(h.start())
    assert result.ok, result.message
    assert output_totals(tmp_path) == expected_totals(tmp_path)
    # partial#1 again (its partition was damaged and final#1, final#2... read it), then final#1.
    assert h.runtime.keys() == [(P, 1, 1), (F, 1, 1)]
    assert result.recovery is not None
    assert (result.recovery.lost_results, result.recovery.rerun_results) == (1, 1)
    released = [e.partition for e in h.publisher.of(r.PartitionReleased)]
    assert released[0] == r.PartitionRef(P, 1, 0)
    (marker,) = h.publisher.of(r.JobRecovered)
    assert marker.lost_results == (
        r.LostResult(r.PartitionRef(P, 1, 0), r.ResultLoss.CHECKSUM_MISMATCH, True),
    )
    assert marker.kept_results == (r.PartitionRef(P, 0, 0),)


def test_a_failure_of_a_lost_partitions_new_producer_is_restarted(tmp_path: Path) -> None:
    # The failover core learns from JobRecovered that partial#1 runs again: without it, the
    # failure of partial#1's new attempt hid behind the lost result and the job waited.
    job, events, storage = crash_mid_job(tmp_path)
    damaged = partitions.subpartition_path(storage, "job", r.PartitionRef(P, 1, 0), 0)
    Path(damaged).write_bytes(b"not what was written")
    h = recovering(job, events, storage, FAST_RESTART).start()
    assert h.runtime.keys() == [(P, 1, 1)]
    h.end((P, 1, 1), failed_outcome())
    result = run_all(h)
    assert result.ok, result.message
    assert output_totals(tmp_path) == expected_totals(tmp_path)
    restarts = [c for c in h.publisher.local_records if isinstance(c, r.RestartTasks)]
    assert [t for c in restarts for t in c.tasks][:1] == [r.TaskRef(P, 1)]
    assert h.runtime.keys().count((P, 1, 2)) == 1


def test_a_second_recovery_produces_again_what_the_first_found_lost(tmp_path: Path) -> None:
    # The first recovery found partial#1's partition damaged and ran it again; its driver died
    # while that ran. The second rebuilds the loss from the first's JobRecovered: without it,
    # the old AttemptFinished made partial#1 finished (its partition released) and nothing ran.
    job, events, storage = crash_mid_job(tmp_path)
    damaged = partitions.subpartition_path(storage, "job", r.PartitionRef(P, 1, 0), 0)
    Path(damaged).write_bytes(b"not what was written")
    first = recovering(job, events, storage).start()
    assert first.runtime.keys() == [(P, 1, 1)]
    events += [e for e in first.publisher.events if isinstance(e, r.Event)]
    shutil.copytree(tmp_path / "storage-at-crash", tmp_path / "storage-at-second-crash")
    first.stop()
    h = recovering(job, events, Storage(str(tmp_path / "storage-at-second-crash")))
    result = run_all(h.start())
    assert result.ok, result.message
    assert output_totals(tmp_path) == expected_totals(tmp_path)
    assert h.runtime.keys() == [(P, 1, 2), (F, 1, 1)]
    (marker,) = h.publisher.of(r.JobRecovered)
    assert marker.reset_attempts == (r.AttemptRef(P, 1, 1),)
    assert marker.lost_results == ()


def test_a_deleted_sink_part_is_committed_again(tmp_path: Path) -> None:
    job, events, storage = crash_mid_job(tmp_path)
    (tmp_path / "out" / "part-00000.parquet").unlink()
    h = recovering(job, events, storage)
    result = run_all(h.start())
    assert result.ok, result.message
    assert output_totals(tmp_path) == expected_totals(tmp_path)
    assert sorted(h.runtime.keys()) == [(F, 0, 1), (F, 1, 1)]
    (marker,) = h.publisher.of(r.JobRecovered)
    assert marker.lost_results == (
        r.LostResult(r.PartitionRef(F, 0, 0), r.ResultLoss.MISSING, True),
    )
    assert marker.kept_sink_parts == (r.TaskRef(F, 2),)


def test_a_second_recovery_replaces_the_first_recovered_run(tmp_path: Path) -> None:
    job, events, _ = crash_mid_job(tmp_path)
    n = len(events)
    first = r.JobRecovered(
        job_id="job",
        ts=events[-1].ts + 1,
        id=f"job-e{n + 1}",
        replaced_run="job-e1",
        last_sequence=n,
        last_event_ts=events[-1].ts,
        log_source="test",
        reset_attempts=(),
        kept_results=(),
        kept_sink_parts=(),
        lost_results=(),
        commands_handled=0,
    )
    rebuilt = rebuild(_state(job), JobLog("job", (*events, first), {}, "test"))
    assert rebuilt.marker("test")["replaced_run"] == first.id
    assert rebuilt.marker("test")["last_sequence"] == n + 1


def _state(job: Job) -> ExecutionState:
    return ExecutionState(chain(job), 12)


def test_an_ended_job_is_not_recovered(tmp_path: Path) -> None:
    job, events, _ = crash_mid_job(tmp_path)
    finished = r.JobFinished(job_id="job", ts=1, id="job-e999", status=r.JobStatus.SUCCEEDED)
    with pytest.raises(RecoveryError, match=r"already ended .SUCCEEDED.*run the job afresh"):
        rebuild(_state(job), JobLog("job", (*events, finished), {}, "test"))
    with pytest.raises(RecoveryError, match="holds no JobSubmitted"):
        rebuild(_state(job), JobLog("job", tuple(events[1:]), {}, "test"))


def test_a_failed_job_and_a_restart_without_its_command_are_not_recovered(tmp_path: Path) -> None:
    job, events, _ = crash_mid_job(tmp_path)
    n = len(events)

    def applied(kind: str, k: int) -> r.CommandApplied:
        return r.CommandApplied(
            job_id="job", ts=1, id=f"job-e{n + k}", command_id=f"c{k}", command_type=kind
        )

    with pytest.raises(RecoveryError, match="failed by c1"):
        rebuild(_state(job), JobLog("job", (*events, applied("FailJob", 1)), {}, "test"))
    with pytest.raises(RecoveryError, match=r"RestartTasks c2 was applied.*does not hold"):
        rebuild(_state(job), JobLog("job", (*events, applied("RestartTasks", 2)), {}, "test"))


def test_another_job_graph_is_refused_before_anything_is_recorded(tmp_path: Path) -> None:
    _, events, storage = crash_mid_job(tmp_path)
    other = sales_job(tmp_path / "other", final_parallelism=4)
    h = recovering(other, events, storage)
    with pytest.raises(RecoveryError, match="not the one its log recorded"):
        h.driver.run()
    assert h.publisher.events == []


def test_the_cores_and_replay_take_the_recovered_log_with_its_marker(tmp_path: Path) -> None:
    job, events, decided, storage = crash_with_decisions(tmp_path)
    h = recovering(job, events, storage)
    assert run_all(h.start()).ok
    log = [*events, *h.publisher.events]
    assert sum(isinstance(e, r.JobRecovered) for e in log) == 1
    decisions = [*decided, *h.publisher.local_records]
    assert decisions, "the fallbacks decided nothing: the replay below would compare nothing"
    recorded = [Recorded(r.EVENTS_TOPIC, e) for e in log]
    recorded += [Recorded(r.COMMANDS_TOPIC, c) for c in decisions]
    report = replay(recorded, Settings(QUIET))
    assert report.differences == 0, [s.line() for s in report.services]
    assert sum(s.reproduced for s in report.services) == len(decisions)
    # With nothing lost, each core that reads events has nothing to act on in the marker (the
    # failover acts on lost results produced again: the test above): the same outputs and
    # metrics with it and without it. (The speculator and the blocklist read findings only.)
    without = [e for e in log if not isinstance(e, r.JobRecovered)]
    for spec in SERVICES:
        if spec.input_topic != r.EVENTS_TOPIC:
            continue
        with_marker, plain = spec.core(Settings(QUIET)), spec.core(Settings(QUIET))
        outputs = [out for e in log for out in with_marker.handle(e)]
        assert outputs == [out for e in without for out in plain.handle(e)], spec.name
        assert with_marker.metrics() == plain.metrics(), spec.name  # type: ignore[attr-defined]
