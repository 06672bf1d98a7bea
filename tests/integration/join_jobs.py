"""The job and checks the join tests share on `local[2]` and on the 3-worker cluster: every join
type over two Parquet inputs whose keys repeat on both sides (5% null), each join's build side
above its memory bound in every subtask."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from tests.join_reference import spark_join

from tailguard.agent.graph.api import Job
from tailguard.testing import JobRun, assert_output_equals, assert_succeeded

HOWS = ("inner", "left", "right", "full", "semi", "anti")
POLICY = {
    "execution.batch.adaptive.auto-parallelism.avg-data-volume-per-task": "64 KiB",
    "execution.batch.adaptive.auto-parallelism.max-parallelism": "4",
    # The shuffled hash join: both sides hash-partitioned, each subtask's share of the build
    # side above its bound (the left side, under 1 MiB, would be broadcast for the inner and
    # right joins; the adaptive broadcast join has tests of its own, broadcast_join_job.py).
    "table.optimizer.adaptive-broadcast-join.strategy": "none",
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


def every_join(tmp: Path) -> tuple[Job, Path, Path]:
    """One job joining the same two inputs six ways, one sink per join type."""
    left_dir = write_side(tmp / "left", 30_000, 4_000, "a", seed=1)
    right_dir = write_side(tmp / "right", 60_000, 4_000, "b", seed=2)
    job = Job("joins")
    left = job.read_parquet(str(left_dir), name="left")
    right = job.read_parquet(str(right_dir), name="right")
    for how in HOWS:
        joined = left.join(right, on="k", how=how, memory=MEMORY, name=f"join_{how}")
        joined.write_parquet(str(tmp / "out" / how), name=f"sink_{how}")
    return job, left_dir, right_dir


def assert_every_join_exact_and_spilled(job_run: JobRun, left_dir: Path, right_dir: Path) -> None:
    assert_succeeded(job_run)
    left, right = pq.read_table(left_dir).to_pandas(), pq.read_table(right_dir).to_pandas()
    for how in HOWS:
        expected = spark_join(left, right, ["k"], how)
        sink = f"join_{how}→sink_{how}"  # the join heads a chain, its sink chained to it
        assert_output_equals(job_run, expected, sink=sink, ignore_order=True, check_types=False)
        # Several subtasks, each with the keys of its subpartitions from both sides.
        assert job_run.result.parallelism[sink][0] >= 2
        assert job_run.output(sink).column_names == list(expected.columns)
        winners = [a for a in job_run.attempts(f"join_{how}") if a.won]
        assert winners and all(a.spilled_bytes > 0 for a in winners), (
            f"{how}: a subtask held a build side above its bound without spilling: "
            f"{[(a.subtask, a.spilled_bytes) for a in winners]}"
        )
    assert "spilled to local disk" in job_run.summary()
