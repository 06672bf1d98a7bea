"""`scheduler.subtask-order=largest-input-first` on Spark in local mode: the head chain's
subtasks are deployed largest assigned input first, the output is exact, and replay reproduces
every decision (the order is the agent's, not a service's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tailguard.examples import sales_by_region
from tailguard.model import records as r
from tailguard.testing import assert_output_equals, assert_replay_clean, assert_succeeded, run_job

pytestmark = pytest.mark.spark

HEAD = "sales→score→partial"


def test_largest_input_first_deploys_by_bytes_and_replays(
    tailguard_local_spark: Any, tmp_path: Path
) -> None:
    # Files of different sizes, so the head's subtasks are assigned different bytes.
    data = tmp_path / "sales"
    data.mkdir()
    for index, rows in enumerate((500, 4_000, 1_500)):
        made = sales_by_region.generate(
            tmp_path / f"gen{index}", files=1, rows_per_file=rows, row_groups_per_file=1
        )
        (made / "sales-0000.parquet").rename(data / f"sales-{index}.parquet")
    out = tmp_path / "out"
    job_run = run_job(
        sales_by_region.make_job(data, out),
        tailguard_local_spark,
        tmp_path,
        settings={
            "execution.batch.adaptive.auto-parallelism.avg-data-volume-per-task": "16 KiB",
            "execution.batch.adaptive.auto-parallelism.max-parallelism": "8",
            "scheduler.subtask-order": "largest-input-first",
        },
    )
    assert_succeeded(job_run)
    assert_output_equals(job_run, sales_by_region.reference(data), ignore_order=True)

    records = job_run.records
    deployed = [
        e.subtask for e in records if isinstance(e, r.AttemptDeploying) and e.vertex == HEAD
    ]
    sizes = {
        e.subtask: e.input_bytes
        for e in records
        if isinstance(e, r.AttemptFinished) and e.vertex == HEAD
    }
    assert len(set(sizes.values())) > 1, sizes  # the check below could not fail otherwise
    in_order = [sizes[s] for s in deployed]
    assert in_order == sorted(in_order, reverse=True), (deployed, sizes)
    assert deployed != sorted(deployed), "index order would have passed unnoticed"
    assert_replay_clean(job_run)
