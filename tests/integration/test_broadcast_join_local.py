"""The adaptive broadcast join on Spark in local mode (`local[2]`): a join whose small side is
small only once produced (a filter of a large input) becomes a broadcast join. The small side is
produced first and the large side held until the decision, then run inside the join's subtasks
(each runs its large partition's chain: no attempt of the large side, no partition file of it);
the output equals pandas `merge`, and the archive replays with 0 differences
(`broadcast_join_job.py`; the same job runs on the 3-worker cluster in
test_broadcast_join_cluster.py). With the rule off the large side runs on its own and is
hash-split, so the checks on it can fail."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.integration.broadcast_join_job import (
    POLICY,
    assert_broadcast_and_fused,
    broadcast_job,
    expected_output,
    finished,
)

from tailguard.model import records as r
from tailguard.testing import assert_output_equals, assert_succeeded, run_job

pytestmark = pytest.mark.spark


def test_a_small_side_known_only_at_run_time_is_broadcast_and_the_large_side_not_shuffled(
    tailguard_local_spark: Any, tmp_path: Path
) -> None:
    job, large_dir, dims_dir = broadcast_job(tmp_path)
    job_run = run_job(job, tailguard_local_spark, tmp_path, settings=POLICY)
    assert_broadcast_and_fused(job_run, large_dir, dims_dir)


def test_with_the_rule_off_the_large_side_is_hash_partitioned(
    tailguard_local_spark: Any, tmp_path: Path
) -> None:
    job, large_dir, dims_dir = broadcast_job(tmp_path)
    settings = {**POLICY, "table.optimizer.adaptive-broadcast-join.strategy": "none"}

    job_run = run_job(job, tailguard_local_spark, tmp_path, settings=settings)

    assert_succeeded(job_run)
    assert all(c.broadcast is None for c in job_run.of(r.SetParallelism))
    # One subpartition per join subtask the join may have (max-parallelism 4).
    assert {len(e.bytes_per_subpartition) for e in finished(job_run, "large")} == {4}
    assert_output_equals(
        job_run, expected_output(large_dir, dims_dir), ignore_order=True, check_types=False
    )
