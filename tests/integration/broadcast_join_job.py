"""The job and checks the adaptive broadcast join tests share on `local[2]` and on the 3-worker
cluster: a left join whose right side is small only once produced (a filter keeping about 1% of
a dimension table), and what must hold once it ran."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tests.integration.join_jobs import POLICY as JOIN_POLICY
from tests.integration.join_jobs import write_side
from tests.join_reference import spark_join

from tailguard.agent.graph.api import Job
from tailguard.model import records as r
from tailguard.testing import JobRun, assert_output_equals, assert_replay_clean, assert_succeeded

# The join tests' settings with the rule on, at its defaults (1 MiB).
POLICY = {**JOIN_POLICY, "table.optimizer.adaptive-broadcast-join.strategy": "auto"}

# Keys below this survive the filter: about 1% of the dimension side's rows.
KEPT_KEYS = 40


def keep_few_keys(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch.filter(pc.less(batch["k"], KEPT_KEYS))


def broadcast_job(tmp: Path) -> tuple[Job, Path, Path]:
    large_dir = write_side(tmp / "large", 30_000, 4_000, "a", seed=5)
    dims_dir = write_side(tmp / "dims", 30_000, 4_000, "b", seed=6)
    job = Job("adaptive-broadcast")
    large = job.read_parquet(str(large_dir), name="large")
    # Its splits are as large as the large side's; what it produces is known only at run time.
    small = job.read_parquet(str(dims_dir), name="dims").map_batches(keep_few_keys, name="few")
    large.join(small, "k", "left", name="enrich").write_parquet(str(tmp / "out"), name="sink")
    return job, large_dir, dims_dir


def expected_output(large_dir: Path, dims_dir: Path) -> Any:
    dims = pq.read_table(dims_dir).to_pandas()
    return spark_join(
        pq.read_table(large_dir).to_pandas(), dims[dims["k"] < KEPT_KEYS], ["k"], "left"
    )


def finished(job_run: JobRun, chain: str) -> list[r.AttemptFinished]:
    return [e for e in job_run.of(r.AttemptFinished) if e.vertex == chain]


def assert_broadcast_and_fused(job_run: JobRun, large_dir: Path, dims_dir: Path) -> None:
    """The join became a broadcast join of its filtered side, produced first; the large side,
    held until the decision, was never deployed on its own or written: each join subtask ran
    its partitions' chains inside its attempt (one large partition per join subtask); the
    output is exact and the archive replays with 0 differences."""
    assert_succeeded(job_run)
    (decision,) = [c for c in job_run.of(r.SetParallelism) if c.broadcast is not None]
    assert decision.vertex == "enrich→sink"
    assert decision.broadcast == r.BroadcastJoin(
        "dims→few", "right", decision.broadcast.bytes, 1024 * 1024
    )
    assert 0 < decision.broadcast.bytes < 1024 * 1024
    # Not shuffled, not written: no attempt of the large side ever ran (so none wrote a
    # partition file); it ran inside the join's subtasks.
    assert not [e for e in job_run.of(r.AttemptDeploying) if e.vertex == "large"]
    assert job_run.result.fused == {"large": "enrich→sink"}
    # The small side was produced first; the join started only once it had finished.
    events = job_run.of(r.Event)
    small_done = max(events.index(e) for e in finished(job_run, "dims→few"))
    join_started = min(
        events.index(e) for e in job_run.of(r.AttemptDeploying) if e.vertex == "enrich→sink"
    )
    assert small_done < join_started
    (large,) = [e for e in job_run.of(r.VertexInitialized) if e.vertex == "large"]
    (init,) = [e for e in job_run.of(r.VertexInitialized) if e.vertex == "enrich→sink"]
    read = sorted(
        (rng.partition_start, rng.partition_end, rng.subpartition_start, rng.subpartition_end)
        for s in init.subtask_inputs
        for rng in s.inputs
        if rng.input == "large"
    )
    assert read == [(k, k, 0, 0) for k in range(large.parallelism)]
    assert_output_equals(
        job_run, expected_output(large_dir, dims_dir), ignore_order=True, check_types=False
    )
    assert_replay_clean(job_run)
