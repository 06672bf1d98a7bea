"""The adaptive broadcast join on the 3-worker standalone cluster: the job of
`broadcast_join_job.py` (its small side known only at run time) becomes a broadcast join, the
large side run inside the join's subtasks (never shuffled or written), the output exact and the
archive replayed with 0 differences; the same job runs on `local[2]` in
test_broadcast_join_local.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.integration.broadcast_join_job import (
    POLICY,
    assert_broadcast_and_fused,
    broadcast_job,
)

from tailguard.testing import run_job

pytestmark = [pytest.mark.long, pytest.mark.spark, pytest.mark.tailguard_cluster(workers=3)]


def test_a_small_side_known_only_at_run_time_is_broadcast_on_three_hosts(
    tailguard_spark: Any, tmp_path: Path
) -> None:
    job, large_dir, dims_dir = broadcast_job(tmp_path)
    # Every host's runner joins before placement: on the first alone (the default) a loaded
    # machine ran the whole job on one host.
    job_run = run_job(
        job, tailguard_spark, tmp_path, settings={**POLICY, "tailguard.runners.min-ratio": "1"}
    )
    assert_broadcast_and_fused(job_run, large_dir, dims_dir)
    assert len({a.host for a in job_run.result.attempts}) >= 2, "the attempts ran on one host"
