"""Driver recovery (issue 14, item 1): a local[2] job whose driver process is killed with -9
mid-job is taken over by `tailguard.run(..., recover=JOB_ID)` and finishes with exact output,
0 replay differences, no command applied twice and only the lost attempts run again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import tailguard
from tailguard.codec import codec_for
from tailguard.examples import sales_by_region
from tailguard.kafka.consumer import RecordConsumer
from tailguard.model import records as r
from tailguard.testing import JobRun, assert_output_equals, assert_replay_clean, assert_succeeded
from tailguard.testing.harness import Services
from tailguard.testing.jobrun import run_settings, ship_job_code

sys.path.insert(0, str(Path(__file__).parent))
import recovery_job

SETTINGS = {
    "execution.batch.adaptive.auto-parallelism.max-parallelism": "8",
    "restart-strategy.type": "fixed-delay",
    "restart-strategy.fixed-delay.delay": "100 ms",
}
# A driver killed and another taking over (minutes): make test-long; the recovery logic is
# tested in tests/unit/test_agent_recovery.py.
pytestmark = [
    pytest.mark.long,
    pytest.mark.spark,
    pytest.mark.tailguard_services(settings=SETTINGS),
]

# Seconds each batch of the last stage takes: long enough that the final stage is still running
# when its first subtask commits (4 subtasks on 2 slots), short enough for the default suite.
SLOW_S = 1.0
# A bound on awaiting the driver's progress, not a wait: the event ends it.
EVENT_TIMEOUT_S = 600.0


def _events(settings: Any) -> RecordConsumer:
    return RecordConsumer(
        settings,
        codec_for(settings),
        [r.EVENTS_TOPIC],
        group_id=f"recovery-test-{uuid.uuid4().hex[:8]}",
        from_beginning=True,
    )


def _await_first_commit(
    consumer: RecordConsumer, job_id: str, driver: subprocess.Popen[bytes], driver_log: Path
) -> list[r.Event]:
    """The job's events up to the first finished subtask of the sink's chain."""
    seen: list[r.Event] = []
    deadline = time.monotonic() + EVENT_TIMEOUT_S
    while time.monotonic() < deadline:
        if driver.poll() is not None:
            raise AssertionError(
                f"the driver ended by itself ({driver.returncode}):\n"
                + driver_log.read_text()[-3000:]
            )
        for item in consumer.poll(0.2):
            event = item.record
            if event.job_id != job_id or not isinstance(event, r.Event):
                continue
            seen.append(event)
            if isinstance(event, r.AttemptFinished) and event.vertex.endswith("sink"):
                return seen
    kinds = [f"{type(e).__name__}:{getattr(e, 'vertex', '')}" for e in seen]
    raise AssertionError(
        f"no sink subtask of {job_id} finished within {EVENT_TIMEOUT_S} s; events: {kinds}; "
        f"the driver's output:\n{driver_log.read_text()[-3000:]}"
    )


def test_driver_killed_mid_job_is_recovered_exactly(
    tailguard_local_spark: Any, tailguard_services: Services, tmp_path: Path
) -> None:
    data = sales_by_region.generate(tmp_path / "sales", files=4, rows_per_file=2_000)
    out = tmp_path / "out"
    settings = run_settings(tmp_path, tailguard_services, None)
    job_id = f"recovery-sales-{uuid.uuid4().hex[:8]}"
    consumer = _events(settings)
    driver_log = (tmp_path / "driver.log").open("wb")
    driver = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).parent / "recovery_driver.py"),
            job_id,
            str(data),
            str(out),
            str(SLOW_S),
            json.dumps(dict(settings.overrides())),
        ],
        stdout=driver_log,
        stderr=subprocess.STDOUT,
    )
    try:
        before = _await_first_commit(consumer, job_id, driver, tmp_path / "driver.log")
        os.kill(driver.pid, signal.SIGKILL)
    finally:
        if driver.poll() is None:
            driver.kill()
        driver.wait()
        consumer.close()
        driver_log.close()
    job = recovery_job.make_job(data, out, SLOW_S)
    ship_job_code(job)
    result = tailguard.run(
        job,
        tailguard_local_spark,
        settings=settings,
        recover=job_id,
        progress=False,
    )
    run = JobRun(job, result, settings, tmp_path)
    assert_succeeded(run)
    assert_output_equals(run, sales_by_region.reference(data), ignore_order=True)
    assert_replay_clean(run)

    summary = result.recovery
    assert summary is not None
    events = run.of(r.Event)
    # The dead driver's log (the archive completed from the topic) and the recovered run's.
    dead, recovered = events[: summary.events_before], events[summary.events_before :]
    assert [e.id for e in dead[: len(before)]] == [e.id for e in before]
    ended = {
        (e.vertex, e.subtask, e.attempt)
        for e in dead
        if isinstance(e, r.AttemptFinished | r.AttemptFailed | r.AttemptCanceled)
    }
    deployed = [(e.vertex, e.subtask, e.attempt) for e in dead if isinstance(e, r.AttemptDeploying)]
    running_at_kill = [a for a in deployed if a not in ended]
    finished_before = {(e.vertex, e.subtask) for e in dead if isinstance(e, r.AttemptFinished)}
    assert summary.lost_attempts == len(running_at_kill) >= 1, summary
    assert summary.lost_results == 0, summary
    assert summary.kept_results == len(finished_before), summary
    # The takeover is the recovered driver's first event, and says what the checks above found.
    marker = recovered[0]
    assert isinstance(marker, r.JobRecovered), recovered[:3]
    assert (marker.replaced_run, marker.last_sequence) == (dead[0].id, len(dead))
    assert marker.last_event_ts == dead[-1].ts
    assert sorted((a.vertex, a.subtask, a.attempt) for a in marker.reset_attempts) == sorted(
        running_at_kill
    )
    assert len(marker.kept_results) + len(marker.kept_sink_parts) == len(finished_before)
    assert marker.kept_sink_parts, "the kill came after a sink subtask committed"
    assert marker.lost_results == ()
    handled = {e.command_id for e in dead if isinstance(e, r.CommandApplied | r.CommandRejected)}
    assert marker.commands_handled == len(handled) >= 1
    # One continuous job: one JobSubmitted, one JobFinished, ids in one sequence, no gaps.
    assert len([e for e in events if isinstance(e, r.JobSubmitted)]) == 1
    assert len([e for e in events if isinstance(e, r.JobFinished)]) == 1
    sequences = [int(e.id.rsplit("-e", 1)[1]) for e in events]
    assert sequences == list(range(1, len(events) + 1))
    # Each command applied once, across both drivers.
    applied = [e.command_id for e in events if isinstance(e, r.CommandApplied)]
    assert len(applied) == len(set(applied)), applied
    # Nothing finished before the kill ran again; what ran again is what was running.
    after = [e for e in recovered if isinstance(e, r.AttemptDeploying)]
    assert not [e for e in after if (e.vertex, e.subtask) in finished_before], after
    reruns = [e for e in after if (e.vertex, e.subtask) in {(v, k) for v, k, _ in deployed}]
    assert len(reruns) <= summary.lost_attempts, (reruns, summary)
    print(
        f"\nrecovery: {summary.line()}; {len(reruns)} re-run(s) for "
        f"{len(running_at_kill)} attempt(s) running at the kill; the recovered run took "
        f"{result.duration_s:.1f} s"
    )
