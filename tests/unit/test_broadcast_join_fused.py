"""A broadcast join's other side fused into the join (agent/driver/broadcast_joins.py), run
through the driver with real attempts: a failed join attempt runs the fused side again, and an
inner join whose small side is the left one produces it first (its sources read fewer bytes), so
the large right side is fused too. Each run's output is checked against pandas `merge`."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from agent_fakes import FakeRuntime, Harness, run_all
from test_agent_driver import FAST_RESTART

from tailguard.agent.executor.storage import Storage
from tailguard.agent.graph.api import Job
from tailguard.inspect.history import history_of
from tailguard.inspect.timeline import build_timeline
from tailguard.model import records as r

SETTINGS = {
    "table.optimizer.adaptive-broadcast-join.strategy": "auto",
    "execution.batch.adaptive.auto-parallelism.max-parallelism": "4",
    # The large side (128 KB of rows) too large to broadcast, the filtered side (20 rows) not.
    "table.optimizer.join.broadcast-threshold": "16 kb",
    **FAST_RESTART,
}
JOIN = "enrich→sink"
KEPT = 20  # keys below it survive the small side's filter


def _keep_few(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch.filter(pc.less(batch["k"], KEPT))


def join_job(tmp: Path, how: str = "left", small_left: bool = False) -> Job:
    """A large side (two files of two row groups: four splits) joined with a dimension table
    filtered to a tenth of its keys; the dimension file is smaller than the large side's files.
    Also the job of test_broadcast_join_recovery.py."""
    (tmp / "large").mkdir(parents=True)
    (tmp / "dims").mkdir()
    for n in range(2):
        keys = pa.array([(7 * i + n) % 200 for i in range(4000)], pa.int64())
        pq.write_table(
            pa.table({"k": keys, "a": pa.array(range(4000), pa.int64())}),
            tmp / "large" / f"part-{n}.parquet",
            row_group_size=2000,
        )
    pq.write_table(
        pa.table({"k": pa.array(range(200), pa.int64()), "b": pa.array(range(200), pa.int64())}),
        tmp / "dims" / "dims.parquet",
    )
    job = Job("broadcast-fused")
    large = job.read_parquet(str(tmp / "large"), name="large")
    small = job.read_parquet(str(tmp / "dims"), name="dims").map_batches(_keep_few, name="few")
    joined = (
        small.join(large, "k", how, name="enrich")
        if small_left
        else large.join(small, "k", how, name="enrich")
    )
    joined.write_parquet(str(tmp / "out"), name="sink")
    return job


def expected_rows(tmp: Path, how: str = "left") -> list[tuple[int, int, int | None]]:
    large = pq.read_table(tmp / "large").to_pandas()
    dims = pq.read_table(tmp / "dims").to_pandas()
    joined = large.merge(dims[dims["k"] < KEPT], on="k", how=how)
    return sorted(
        (int(k), int(a), None if b != b else int(b))
        for k, a, b in joined[["k", "a", "b"]].itertuples(index=False)
    )


def output_rows(tmp: Path) -> list[tuple[int, int, int | None]]:
    table = pq.read_table(tmp / "out").select(["k", "a", "b"])
    return sorted(zip(*(table[c].to_pylist() for c in ("k", "a", "b")), strict=True))


def _harness(tmp: Path, job: Job) -> Harness:
    return Harness(job, FakeRuntime.hosts(a=2), Storage(str(tmp / "storage")), settings=SETTINGS)


def test_a_failed_join_attempt_runs_its_fused_side_again(tmp_path: Path) -> None:
    """A join attempt that fails mid-stream (its sink part half written) is restarted alone and
    reads the large side's splits again: the output is still exact, and the large side never
    runs on its own."""
    h = _harness(tmp_path, join_job(tmp_path, "left", small_left=False))
    h.driver.hooks.fail_attempts[(JOIN, 0, 0)] = "injected after the first batch"
    result = run_all(h.start())
    assert result.ok, result.message
    assert result.fused == {"large": JOIN}
    assert not [e for e in h.publisher.of(r.AttemptDeploying) if e.vertex == "large"]
    (failed,) = [e for e in h.publisher.of(r.AttemptFailed) if e.vertex == JOIN]
    assert (failed.subtask, failed.attempt, failed.error) == (0, 0, r.ErrorKind.USER)
    won = [a.attempt for a in result.attempts if (a.vertex, a.subtask, a.won) == (JOIN, 0, True)]
    assert won == [1]
    assert output_rows(tmp_path) == expected_rows(tmp_path, "left")


def test_an_inner_join_with_its_small_side_on_the_left_fuses_the_right_side(
    tmp_path: Path,
) -> None:
    """The left side's sources read fewer bytes, so it is produced first, decided broadcast once
    it finished small, and the large right side runs inside the join."""
    h = _harness(tmp_path, join_job(tmp_path, "inner", small_left=True))
    # Before the splits are known: the right side first, as for any inner join.
    assert h.driver.state.broadcast_joins.joins[JOIN].first == "large"
    result = run_all(h.start())
    assert result.ok, result.message
    assert h.driver.state.broadcast_joins.joins[JOIN].first == "dims→few"
    (decision,) = [
        c
        for c in h.publisher.local_records
        if isinstance(c, r.SetParallelism) and c.broadcast is not None
    ]
    assert (decision.broadcast.input, decision.broadcast.side) == ("dims→few", "left")
    assert result.fused == {"large": JOIN}
    assert not [e for e in h.publisher.of(r.AttemptDeploying) if e.vertex == "large"]
    assert output_rows(tmp_path) == expected_rows(tmp_path, "inner")
    # The timeline shows the large side done, inside the join, though it had no attempt.
    timeline = build_timeline(history_of([*h.publisher.events, *h.publisher.local_records]))
    (large,) = [p for p in timeline.vertices if p.vertex == "large"]
    assert (large.attempts, large.done) == (0, True)
    assert large.decided_by.endswith(f"; ran inside {JOIN}")
