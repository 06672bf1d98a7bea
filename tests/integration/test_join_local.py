"""The relational join (`a.join(b, on=..., how=...)`) on Spark in local mode (`local[2]`): every
join type against pandas `merge` with Spark's null rules, with a build side larger than its
memory bound in every subtask (the attempts report what they spilled), and a broadcast join
whose large side is read as it is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tests.join_reference import spark_join

from tailguard.agent.graph.api import Job
from tailguard.model.records import Distribution
from tailguard.testing import JobRun, assert_output_equals, assert_succeeded, run_job

pytestmark = pytest.mark.spark

HOWS = ("inner", "left", "right", "full", "semi", "anti")
POLICY = {
    "execution.batch.adaptive.auto-parallelism.avg-data-volume-per-task": "64 KiB",
    "execution.batch.adaptive.auto-parallelism.max-parallelism": "4",
}
# Far below each subtask's share of either side (~60,000 rows over at most 4 subtasks).
MEMORY = "64 KiB"


def write_side(path: Path, rows: int, keys: int, payload: str, seed: int) -> Path:
    """Parquet files of (k, payload, payload_text): keys repeat on both sides (many to many),
    5% of them null."""
    rng = np.random.default_rng(seed)
    path.mkdir(parents=True)
    per_file = rows // 3
    for f in range(3):
        k = pd.array(rng.integers(0, keys, per_file), dtype="Int64")
        k[rng.random(per_file) < 0.05] = pd.NA
        table = pa.table(
            {
                "k": pa.array(k, pa.int64()),
                payload: np.arange(f * per_file, (f + 1) * per_file, dtype=np.int64),
                f"{payload}_text": rng.choice(["x", "yy", "zzz"], per_file),
            }
        )
        pq.write_table(table, path / f"part-{f}.parquet", row_group_size=per_file // 2)
    return path


def run(job: Job, spark: Any, tmp: Path) -> JobRun:
    return run_job(job, spark, tmp, settings=POLICY)


def test_every_join_type_equals_pandas_merge_and_spills_its_build_side(
    tailguard_local_spark: Any, tmp_path: Path
) -> None:
    left_dir = write_side(tmp_path / "left", 30_000, 4_000, "a", seed=1)
    right_dir = write_side(tmp_path / "right", 60_000, 4_000, "b", seed=2)
    job = Job("joins")
    left = job.read_parquet(str(left_dir), name="left")
    right = job.read_parquet(str(right_dir), name="right")
    for how in HOWS:
        joined = left.join(right, on="k", how=how, memory=MEMORY, name=f"join_{how}")
        joined.write_parquet(str(tmp_path / "out" / how), name=f"sink_{how}")

    job_run = run(job, tailguard_local_spark, tmp_path)

    assert_succeeded(job_run)
    left_frame, right_frame = (
        pq.read_table(left_dir).to_pandas(),
        pq.read_table(right_dir).to_pandas(),
    )
    for how in HOWS:
        expected = spark_join(left_frame, right_frame, ["k"], how)
        sink = f"join_{how}→sink_{how}"  # the join heads a chain, its sink chained to it
        assert_output_equals(job_run, expected, sink=sink, ignore_order=True, check_types=False)
        # Several subtasks, each with the keys of its subpartitions from both sides.
        assert job_run.result.parallelism[sink][0] >= 2
        output = job_run.output(sink)
        assert output.column_names == list(expected.columns)
        winners = [a for a in job_run.attempts(f"join_{how}") if a.won]
        assert winners and all(a.spilled_bytes > 0 for a in winners), (
            f"{how}: a subtask held a build side above its bound without spilling: "
            f"{[(a.subtask, a.spilled_bytes) for a in winners]}"
        )
    assert "spilled to local disk" in job_run.summary()


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
