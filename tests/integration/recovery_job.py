"""The job of the driver-recovery test: sales by region with a last stage slow enough to kill
the driver while it runs (a job file for `tailguard run` too: `main(params)`)."""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from tailguard.agent.graph.api import Job
from tailguard.examples.sales_by_region import partial_sums_of_batches, score

# The final stage's parallelism: more subtasks than local[2] has slots, so some are still
# waiting or running when the first one commits.
FINAL_SUBTASKS = 4


def _slow(seconds: float, batch: pa.RecordBatch) -> pa.RecordBatch:
    # The stage's work (a wall-clock wait standing in for I/O), not a synchronisation.
    time.sleep(seconds)
    return batch


def make_job(data: str | Path, out: str | Path, slow_s: float = 0.0) -> Job:
    job = Job("recovery-sales")
    sales = job.read_parquet(str(data), name="sales")
    partial = sales.map_batches(score, name="score").map_in_arrow(
        partial_sums_of_batches, name="partial"
    )
    totals = partial.partition_by("region").aggregate(
        revenue=("revenue", "sum"),
        orders=("orders", "sum"),
        name="final",
        min_parallelism=FINAL_SUBTASKS,
    )
    totals.map_batches(functools.partial(_slow, slow_s), name="slow").write_parquet(
        str(out), name="sink"
    )
    return job


def main(params: dict[str, Any]) -> Job:
    return make_job(params["data"], params["out"], float(params.get("slow_s", 0)))
