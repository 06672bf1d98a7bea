"""The relational join (`a.join(b, on=..., how=...)`) on Spark in local mode (`local[2]`): every
join type against pandas `merge` with Spark's null rules, with a build side larger than its
memory bound in every subtask (the attempts report what they spilled), and a broadcast join
whose large side is read as it is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from tests.integration.join_jobs import (
    POLICY,
    assert_every_join_exact_and_spilled,
    every_join,
    write_side,
)
from tests.join_reference import spark_join

from tailguard.agent.graph.api import Job
from tailguard.model.records import Distribution
from tailguard.testing import JobRun, assert_output_equals, assert_succeeded, run_job

pytestmark = pytest.mark.spark


def run(job: Job, spark: Any, tmp: Path) -> JobRun:
    return run_job(job, spark, tmp, settings=POLICY)


def test_every_join_type_equals_pandas_merge_and_spills_its_build_side(
    tailguard_local_spark: Any, tmp_path: Path
) -> None:
    job, left_dir, right_dir = every_join(tmp_path)
    assert_every_join_exact_and_spilled(
        run(job, tailguard_local_spark, tmp_path), left_dir, right_dir
    )


def test_a_broadcast_join_reads_the_large_side_as_it_is(
    tailguard_local_spark: Any, tmp_path: Path
) -> None:
    large_dir = write_side(tmp_path / "large", 30_000, 500, "a", seed=3)
    small_dir = write_side(tmp_path / "small", 600, 500, "b", seed=4)
    job = Job("broadcast-join")
    large = job.read_parquet(str(large_dir), name="large")
    small = job.read_parquet(str(small_dir), name="small")
    large.join(small.broadcast(), "k", "left", name="enrich").write_parquet(
        str(tmp_path / "out"), name="sink"
    )
    assert [i.distribution for i in job.vertices["enrich"].inputs] == [
        Distribution.FORWARD,
        Distribution.BROADCAST,
    ]

    job_run = run(job, tailguard_local_spark, tmp_path)

    assert_succeeded(job_run)
    expected = spark_join(
        pq.read_table(large_dir).to_pandas(), pq.read_table(small_dir).to_pandas(), ["k"], "left"
    )
    assert_output_equals(job_run, expected, ignore_order=True, check_types=False)
    # The small side fits its bound in every subtask: nothing was spilled.
    assert all(a.spilled_bytes == 0 for a in job_run.attempts("enrich"))
