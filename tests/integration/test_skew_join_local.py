"""Skewed join splitting on Spark in local mode (`local[2]`): a join whose left side has one hot
key (its subpartition 20x the median) runs that subpartition as several subtasks, each reading
a range of the left side's partitions of it and the right side's whole matching subpartition;
the output equals pandas `merge` and the archive replays with 0 differences. With the strategy
none the hot subpartition is read by one subtask, so the check on its readers can fail."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tests.join_reference import spark_join

from tailguard.agent.graph.api import Job
from tailguard.model import records as r
from tailguard.testing import (
    JobRun,
    assert_output_equals,
    assert_replay_clean,
    assert_succeeded,
    run_job,
)

pytestmark = pytest.mark.spark

HOT = 7
HOT_ROWS = 4_500
KEYS = 400
FILES = 4
POLICY = {
    "execution.batch.adaptive.auto-parallelism.avg-data-volume-per-task": "64 KiB",
    "execution.batch.adaptive.auto-parallelism.max-parallelism": "8",
    # Both sides stay hash-partitioned (the right one is small enough to broadcast).
    "table.optimizer.adaptive-broadcast-join.strategy": "none",
    # Flink's 256 MiB floor would leave a test-sized hot key alone; the factor decides.
    "table.optimizer.skewed-join-optimization.skewed-threshold": "0",
}


def _write(path: Path, frames: list[pa.Table]) -> Path:
    path.mkdir(parents=True)
    for i, table in enumerate(frames):
        pq.write_table(table, path / f"part-{i}.parquet")
    return path


def _sides(tmp: Path) -> tuple[Path, Path]:
    """Left: per file 1,000 rows over KEYS keys and HOT_ROWS rows of key HOT, each row with a
    random double so that bytes follow rows (with 8 subpartitions the hot one holds ~18,000 +
    ~500 rows against ~500: above 20x the median in bytes, which the test checks from what was
    produced). Right: 2 rows per key."""
    rng = np.random.default_rng(11)
    left = []
    for f in range(FILES):
        keys = np.concatenate([rng.integers(0, KEYS, 1_000), np.full(HOT_ROWS, HOT)])
        left.append(
            pa.table(
                {
                    "k": keys.astype(np.int64),
                    "a": np.arange(len(keys), dtype=np.int64) + f * 10_000,
                    "x": rng.random(len(keys)),
                }
            )
        )
    right_keys = np.repeat(np.arange(KEYS, dtype=np.int64), 2)
    right = [pa.table({"k": right_keys, "b": np.arange(len(right_keys), dtype=np.int64)})]
    return _write(tmp / "left", left), _write(tmp / "right", right)


def _job(tmp: Path) -> tuple[Job, Path, Path]:
    left_dir, right_dir = _sides(tmp)
    job = Job("skewed-join")
    left = job.read_parquet(str(left_dir), name="left", parallelism=FILES)
    right = job.read_parquet(str(right_dir), name="right")
    left.join(right, "k", "inner", name="enrich").write_parquet(str(tmp / "out"), name="sink")
    return job, left_dir, right_dir


def _decision(job_run: JobRun) -> r.SetParallelism:
    (decision,) = [c for c in job_run.of(r.SetParallelism) if c.vertex == "enrich→sink"]
    return decision


def _hot_readers(job_run: JobRun, hot: int) -> list[r.SubtaskInputs]:
    (init,) = [e for e in job_run.of(r.VertexInitialized) if e.vertex == "enrich→sink"]
    return [
        s
        for s in init.subtask_inputs
        if any(
            rng.input == "left" and rng.subpartition_start <= hot <= rng.subpartition_end
            for rng in s.inputs
        )
    ]


def _expected(left_dir: Path, right_dir: Path) -> Any:
    return spark_join(
        pq.read_table(left_dir).to_pandas(), pq.read_table(right_dir).to_pandas(), ["k"], "inner"
    )


def test_a_hot_key_runs_as_several_subtasks_with_exact_output(
    tailguard_local_spark: Any, tmp_path: Path
) -> None:
    job, left_dir, right_dir = _job(tmp_path)

    job_run = run_job(job, tailguard_local_spark, tmp_path, settings=POLICY)

    assert_succeeded(job_run)
    decision = _decision(job_run)
    (split,) = decision.skew_splits
    assert split.input == "left" and split.pieces > 1
    # The hot subpartition is 20x the median of the left side's subpartitions (bytes produced).
    produced = [
        e.bytes_per_subpartition for e in job_run.of(r.AttemptFinished) if e.vertex == "left"
    ]
    sizes = sorted(sum(col) for col in zip(*produced, strict=True))
    assert split.bytes == sizes[-1] >= 20 * sizes[len(sizes) // 2]
    readers = _hot_readers(job_run, split.subpartition)
    assert len(readers) == split.pieces
    left_parts = sorted(
        (rng.partition_start, rng.partition_end)
        for s in readers
        for rng in s.inputs
        if rng.input == "left"
        and rng.subpartition_start <= split.subpartition <= rng.subpartition_end
    )
    # The pieces cover the left side's partitions of the hot subpartition once each ...
    assert [p for a, b in left_parts for p in range(a, b + 1)] == list(range(FILES))
    # ... and each piece reads the right side's whole matching subpartition.
    right_parallelism = len(
        {e.subtask for e in job_run.of(r.AttemptFinished) if e.vertex == "right"}
    )
    for s in readers:
        assert any(
            rng.input == "right"
            and (rng.partition_start, rng.partition_end) == (0, right_parallelism - 1)
            and rng.subpartition_start <= split.subpartition <= rng.subpartition_end
            for rng in s.inputs
        )
    assert_output_equals(
        job_run, _expected(left_dir, right_dir), ignore_order=True, check_types=False
    )
    assert_replay_clean(job_run)


@pytest.mark.long
def test_with_the_strategy_none_the_hot_subpartition_has_one_reader(
    tailguard_local_spark: Any, tmp_path: Path
) -> None:
    job, left_dir, right_dir = _job(tmp_path)
    settings = {**POLICY, "table.optimizer.skewed-join-optimization.strategy": "none"}

    job_run = run_job(job, tailguard_local_spark, tmp_path, settings=settings)

    assert_succeeded(job_run)
    assert _decision(job_run).skew_splits == ()
    produced = [
        e.bytes_per_subpartition for e in job_run.of(r.AttemptFinished) if e.vertex == "left"
    ]
    hot = max(range(len(produced[0])), key=lambda s: sum(row[s] for row in produced))
    assert len(_hot_readers(job_run, hot)) == 1
    assert_output_equals(
        job_run, _expected(left_dir, right_dir), ignore_order=True, check_types=False
    )
