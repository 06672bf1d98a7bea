"""The relational join on the 3-worker standalone cluster: every join type against pandas
`merge` with Spark's null rules, the subtasks on three hosts reading each other's partitions,
each subtask's build side above its memory bound (`join_jobs.py`; the same job runs on
`local[2]` in test_join_local.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.integration.join_jobs import POLICY, assert_every_join_exact_and_spilled, every_join

from tailguard.testing import run_job

pytestmark = [pytest.mark.long, pytest.mark.spark, pytest.mark.tailguard_cluster(workers=3)]


def test_every_join_type_is_exact_on_three_hosts(tailguard_spark: Any, tmp_path: Path) -> None:
    job, left_dir, right_dir = every_join(tmp_path)
    job_run = run_job(job, tailguard_spark, tmp_path, settings=POLICY)
    assert_every_join_exact_and_spilled(job_run, left_dir, right_dir)
    assert len({a.host for a in job_run.result.attempts}) >= 2, "the attempts ran on one host"
