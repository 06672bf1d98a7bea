"""A POINTWISE (rescale) consumer with more subtasks than its producer has partitions, on Spark
in local mode (local[2]): the producer writes ceil(P / producers) subpartitions per partition,
the decider cuts byte-balanced runs of (partition, subpartition) slices, some subtask reads a run
of several ranges, and the output is exactly the input's rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tailguard.agent.driver.hooks import JobHooks
from tailguard.agent.graph.api import Job
from tailguard.model import records as r
from tailguard.testing import assert_succeeded, run_job

pytestmark = pytest.mark.spark

ROWS = 6_000
SETTINGS = {
    "execution.batch.adaptive.auto-parallelism.max-parallelism": "8",
    "python.fn-execution.arrow.batch.size": "500",
}


def doubled(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch.append_column("twice", pc.multiply(batch["amount"], 2))


def test_a_rescale_consumer_with_more_subtasks_than_producer_partitions_is_exact(
    tailguard_local_spark: Any, tmp_path: Path
) -> None:
    data = tmp_path / "in.parquet"
    table = pa.table({"id": list(range(ROWS)), "amount": [k % 97 for k in range(ROWS)]})
    pq.write_table(table, data, row_group_size=ROWS // 3)  # three splits
    job = Job("rescale")
    src = job.read_parquet(str(data), name="src", parallelism=3)
    widened = src.rescale().map_batches(doubled, name="widen", min_parallelism=4)
    widened.write_parquet(str(tmp_path / "out"), name="sink")

    events: list[r.Event] = []
    done = run_job(
        job,
        tailguard_local_spark,
        tmp_path,
        settings=SETTINGS,
        hooks=JobHooks(on_event=events.append),
    )
    assert_succeeded(done)

    inits = {e.vertex: e for e in events if isinstance(e, r.VertexInitialized)}
    consumer = next(e for name, e in inits.items() if name.startswith("widen"))
    assert inits["src"].parallelism == 3
    assert consumer.parallelism >= 4  # more subtasks than the producer's 3 partitions
    # ceil(8 / 3) = 3 subpartitions per producer partition: 9 slices for the consumer's runs.
    finished = [e for e in events if isinstance(e, r.AttemptFinished) and e.vertex == "src"]
    assert {len(e.bytes_per_subpartition) for e in finished} == {3}
    runs = [len(s.inputs) for s in consumer.subtask_inputs]
    assert max(runs) >= 2, consumer.subtask_inputs  # a run across the two partitions
    covered = sorted(
        (p, sp)
        for s in consumer.subtask_inputs
        for rng in s.inputs
        for p in range(rng.partition_start, rng.partition_end + 1)
        for sp in range(rng.subpartition_start, rng.subpartition_end + 1)
    )
    assert covered == [(p, sp) for p in range(3) for sp in range(3)]  # each slice once

    out = pq.read_table(str(tmp_path / "out")).sort_by("id")
    expected = table.append_column("twice", pc.multiply(table["amount"], 2))
    assert out.select(["id", "amount", "twice"]).equals(expected)
