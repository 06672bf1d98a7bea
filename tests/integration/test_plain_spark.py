"""The benchmarks' plain-PySpark jobs on a real Spark (local mode), with an exact output.

`bench/plain_spark.py` reaches into the JVM (the status store's stage and task lists, pinned
RDDs), which is where PySpark versions differ if anywhere: marked `spark`, so
`make test-spark35` runs it on PySpark 3.5 as well as 4.x.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.spark_marks import SPARK

from tailguard.bench import plain_spark
from tailguard.examples import sales_by_region as example
from tailguard.testing import Harness

pytestmark = SPARK

FILES, ROW_GROUPS = 3, 2


@pytest.fixture(scope="module")
def spark(tailguard_harness: Harness) -> Iterator[Any]:
    # The benchmark's own plain session, not the plugin's: PySpark allows one per process, so
    # the plugin's session stops first (the next test that asks for it gets a new one).
    tailguard_harness.release_spark()
    session = plain_spark.session_builder("local[2]", "tailguard-plain-test", []).getOrCreate()
    yield session
    session.stop()


@pytest.fixture(scope="module")
def sales(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("plain") / "sales"
    return example.generate(data, files=FILES, rows_per_file=2_000, row_groups_per_file=ROW_GROUPS)


def test_pinned_warm_up_runs_on_the_named_host(spark: Any) -> None:
    assert plain_spark.warm_up(spark.sparkContext, ["localhost"]) == ["localhost"]


@pytest.mark.parametrize(("shape", "stages"), [("sales", 1), ("skew", 1), ("io", 1), ("io", 2)])
def test_plain_job_output_is_exact_and_its_tasks_are_counted(
    spark: Any, sales: Path, tmp_path: Path, shape: str, stages: int
) -> None:
    output = tmp_path / "out"
    run = plain_spark.run_job(
        spark, shape, sales, output, work=0, task_s=0.01, rows_per_split=1_000, stages=stages
    )
    expected = example.reference(sales)
    actual = example.read_output(output)
    assert expected.equals(actual[expected.columns.tolist()])
    assert run.output_rows == len(expected)
    assert run.tasks == FILES * ROW_GROUPS  # one partition per row group
    assert run.speculative_tasks == 0
    # Read from Spark's status store: this job's stages only, each with the work of its tasks.
    # The I/O job's further stages each add one (after their round-robin exchange).
    assert len(run.stage_work) == 1 + stages
    assert all(stage.work_s > 0 for stage in run.stage_work)


def test_the_dataframe_job_scans_a_task_per_file_and_its_output_is_exact(
    spark: Any, tmp_path: Path
) -> None:
    # The bench's frame data: one row group per file (runner.prepare_data), a scan task each.
    files, rows = 4, 600
    data = example.generate(
        tmp_path / "frame", files=files, rows_per_file=rows, row_groups_per_file=1
    )
    output = tmp_path / "out"
    run = plain_spark.run_job(
        spark, "io-frame", data, output, work=0, task_s=0.05, rows_per_split=rows
    )
    expected = example.reference(data)
    actual = example.read_output(output)
    assert expected.equals(actual[expected.columns.tolist()])
    assert run.output_rows == len(expected)
    assert run.tasks == files
    # One scan stage of a task per file (Spark would pack these small files into one task
    # without the open cost); then the groupBy's reduce stage.
    by_stage: dict[int, int] = {}
    for task in run.spark_tasks:
        if task.status == "SUCCESS":
            by_stage[task.stage] = by_stage.get(task.stage, 0) + 1
    assert list(by_stage.values()).count(files) == 1, by_stage
    assert len(run.stage_work) >= 2
