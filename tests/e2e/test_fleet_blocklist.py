"""End to end, the fleet blocklist across jobs (issue 13's acceptance): job A runs with a
throttled host and gets it blocked; job B starts while the block holds, never deploys there, and
its archive shows the fleet block and its cause (A's finding ids); once the block has expired,
job C uses the host again.

Short blocks (25 s) keep the wait for the expiry short; the services run with these settings.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from tailguard.blocklist import fleet_topic
from tailguard.demo import DEMO_POLICY, IO_S_PER_ROW, SLOW_MODE
from tailguard.examples import sales_by_region as example
from tailguard.model import records as r
from tailguard.model.fleet import FLEET_CAUSE_PREFIX, current_entries
from tailguard.testing import (
    Harness,
    JobRun,
    assert_blocked,
    assert_output_equals,
    assert_replay_clean,
    assert_succeeded,
    run_job,
)

SLOW_HOST = "127.0.0.4"
FLEET_POLICY = {
    **DEMO_POLICY,
    "execution.batch.speculative.block-slow-node-duration": "25 s",
    # About one 48 KiB file per subtask: 6 subtasks in two waves over the 3 hosts, so job A
    # places work on the slow host (the demo's 512 KiB gave this data 2 subtasks, which both
    # went to healthy hosts: nothing to find) and job C has a subtask there to show its return.
    "execution.batch.adaptive.auto-parallelism.avg-data-volume-per-task": "48 KiB",
}

# About four minutes on 2 cores (three jobs, a 25 s block to wait out) and sensitive to load (the
# throttled host must stand out): `make test-fleet` runs it, outside the 20-minute `make test`;
# the default suite has the fleet's unit, schema and topic contract tests.
pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("TAILGUARD_FLEET_E2E") != "1",
        reason="fleet blocklist end to end: make test-fleet (TAILGUARD_FLEET_E2E=1)",
    ),
    # The slow host as the demo's (io mode, job A's work I/O-bound): three executors outnumber
    # this machine's two cores, so pausing one (cpu mode) would hand its CPU to the others.
    pytest.mark.tailguard_cluster(workers=3, slow={SLOW_HOST: 5}, slow_mode=SLOW_MODE),
    pytest.mark.tailguard_services(settings=FLEET_POLICY),
]


def _run(
    harness: Harness, node: Any, work: Path, data: Path, name: str, io_s_per_row: float
) -> JobRun:
    job = example.make_job(data, work / "out" / name, name=name, io_s_per_row=io_s_per_row)
    run = run_job(
        job,
        harness.spark_of(node),
        work / "runs" / name,
        services=harness.services_of(node),
    )
    assert_succeeded(run)
    assert_output_equals(run, example.reference(data), ignore_order=True)
    return run


def _hosts_deployed(run: JobRun) -> set[str]:
    return {e.host for e in run.records if isinstance(e, r.AttemptDeploying)}


def test_a_block_earned_by_one_job_holds_for_the_next_until_it_expires(
    tailguard_harness: Harness, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    node = request.node
    data = example.generate(tmp_path / "data", files=6, rows_per_file=8_000)
    settings = tailguard_harness.services_of(node).settings
    with tailguard_harness.slow_hosts_of(node):
        a = _run(tailguard_harness, node, tmp_path, data, "fleet-a", IO_S_PER_ROW)
        assert_blocked(a, SLOW_HOST)
        a_findings = {f.id for f in a.records if isinstance(f, r.SlowTasksDetected)}
        now = int(time.time() * 1000)
        listed = current_entries(fleet_topic.read_changes(settings), now)
        assert SLOW_HOST in listed, f"not on the fleet list: {listed}"
        entry = listed[SLOW_HOST]
        assert set(entry.evidence) <= a_findings and entry.evidence

        b = _run(tailguard_harness, node, tmp_path, data, "fleet-b", 0)
        assert SLOW_HOST not in _hosts_deployed(b)
        [blocked] = [e for e in b.records if isinstance(e, r.NodeBlocked) and e.host == SLOW_HOST]
        assert blocked.cause.startswith(FLEET_CAUSE_PREFIX)
        assert all(finding in blocked.cause for finding in entry.evidence)
        assert blocked.until_ts == entry.until_ts
        first = next(e for e in b.records if isinstance(e, r.AttemptDeploying))
        assert b.records.index(blocked) < b.records.index(first), "blocked after deploying"
        # Each job's archive alone replays exactly (fleet commands checked against its record).
        for run in (a, b):
            assert_replay_clean(run)

        # The block's expiry is a time, not an event: wait for it (at most the 25 s block).
        latest = current_entries(fleet_topic.read_changes(settings), int(time.time() * 1000))
        until = max((e.until_ts or 0) for e in latest.values()) if latest else 0
        time.sleep(max(0.0, until / 1000 - time.time()) + 0.5)
        c = _run(tailguard_harness, node, tmp_path, data, "fleet-c", 0)
        assert SLOW_HOST in _hosts_deployed(c)
        assert not any(
            isinstance(e, r.NodeBlocked) and e.cause.startswith(FLEET_CAUSE_PREFIX)
            for e in c.records
        )
