"""The agent end to end on Spark in local mode: real Spark jobs, real files, no services.

Local mode has one host, so this covers the data path, the dynamic execution graph, the local
fallback decisions, failures and restarts, and the archive — the multi-host behaviour
(placement, speculation, blocking) is in tests/e2e on the standalone cluster.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tailguard.agent.driver.hooks import JobHooks
from tailguard.examples import orders_by_segment, sales_by_region
from tailguard.model import records as r
from tailguard.testing import (
    JobRun,
    assert_output_equals,
    assert_replay_clean,
    assert_succeeded,
    run_job,
)

# Skipped with the reason where there is no JDK (tests/conftest.py). Spark: the plugin's
# `tailguard_local_spark`, one session shared with every other local[2] test.
pytestmark = pytest.mark.spark

POLICY = {
    "execution.batch.adaptive.auto-parallelism.avg-data-volume-per-task": "64 KiB",
    "execution.batch.adaptive.auto-parallelism.max-parallelism": "8",
    "restart-strategy.type": "fixed-delay",
    "restart-strategy.fixed-delay.delay": "100 ms",
}


# The sales example runs as two chains.
HEAD = "sales→score→partial"
TAIL = "final→sink"


def run(job: Any, spark: Any, tmp: Path, hooks: JobHooks | None = None, **extra: str) -> JobRun:
    """The job with the services off: the log in its archive, every decision a fallback."""
    return run_job(job, spark, tmp, settings={**POLICY, **extra}, hooks=hooks)


def assert_exact_sales(run: JobRun, data: Path) -> None:
    assert_succeeded(run)
    assert_output_equals(run, sales_by_region.reference(data), ignore_order=True)


def test_sales_job_matches_pandas_and_replays(tailguard_local_spark: Any, tmp_path: Path) -> None:
    data = sales_by_region.generate(tmp_path / "sales", files=4, rows_per_file=3_000)
    out = tmp_path / "out"
    written: set[str] = set()

    def partitions_so_far(event: r.Event) -> None:
        # Each time the head chain finishes a subtask, which vertices have result partitions.
        if isinstance(event, r.AttemptFinished) and event.vertex == HEAD:
            root = tmp_path / "work" / "storage" / event.job_id / "partitions"
            written.update(p.name for p in root.iterdir())

    hooks = JobHooks(on_event=partitions_so_far)
    job_run = run(sales_by_region.make_job(data, out), tailguard_local_spark, tmp_path, hooks)
    result = job_run.result

    assert_exact_sales(job_run, data)
    # The chain ran as one attempt per subtask, with no partition between its operators.
    assert result.chains == {HEAD: ("sales", "score", "partial"), TAIL: ("final", "sink")}
    assert {a.vertex for a in result.attempts} == {HEAD, TAIL}
    assert len([a for a in result.attempts if a.vertex == HEAD]) == result.parallelism[HEAD][0]
    assert written == {HEAD}, written
    assert (out / "_SUCCESS").exists()
    assert len(list(out.glob("part-*.parquet"))) == result.parallelism[TAIL][0]
    # Every adaptive vertex was decided by the local fallback (services off).
    assert {by for _, by in result.parallelism.values()} == {"agent-fallback"}
    # 4 files x 2 row groups = 8 splits of ~25 KiB: the decider packs them into fewer subtasks.
    assert 1 <= result.parallelism[HEAD][0] <= 8

    report = assert_replay_clean(job_run)
    lines = {s.service: s for s in report.services}
    assert lines["decider"].compared and lines["decider"].reproduced >= 2
    assert not lines["detector"].compared  # services were off: nothing to compare


def test_join_with_broadcast_and_fixed_parallelism(
    tailguard_local_spark: Any, tmp_path: Path
) -> None:
    orders, customers = orders_by_segment.generate(
        tmp_path / "orders", customers=200, files=3, rows_per_file=2_000
    )
    out = tmp_path / "out"
    job = orders_by_segment.make_job(orders, customers, out)
    job.vertices["enrich"].parallelism = 3
    job_run = run(job, tailguard_local_spark, tmp_path)

    assert_succeeded(job_run)
    # A fixed vertex with blocking inputs takes the decider's byte-balanced ranges at its
    # parallelism; with the services off, from the agent's local fallback.
    assert job_run.result.parallelism["enrich"] == (3, "agent-fallback")
    expected = orders_by_segment.reference(orders, customers)
    assert_output_equals(job_run, expected, ignore_order=True)


def test_failed_attempt_is_restarted_and_output_stays_exact(
    tailguard_local_spark: Any, tmp_path: Path
) -> None:
    data = sales_by_region.generate(tmp_path / "sales", files=3, rows_per_file=2_000)
    out = tmp_path / "out"
    hooks = JobHooks(fail_attempts={(HEAD, 0, 0): "injected failure"})
    job_run = run(sales_by_region.make_job(data, out), tailguard_local_spark, tmp_path, hooks)
    result = job_run.result

    assert_exact_sales(job_run, data)
    failed = [a for a in result.attempts if a.status == "FAILED"]
    assert [(a.vertex, a.subtask, a.attempt) for a in failed] == [(HEAD, 0, 0)]
    assert "injected failure" in (failed[0].error or "")
    assert result.restarts >= 1
    assert any("failover" in note for note in result.fallbacks)


def test_restart_limit_fails_the_job(tailguard_local_spark: Any, tmp_path: Path) -> None:
    data = sales_by_region.generate(tmp_path / "sales", files=2, rows_per_file=1_000)
    failing = {(HEAD, 0, n): "always fails" for n in range(5)}
    result = run(
        sales_by_region.make_job(data, tmp_path / "out"),
        tailguard_local_spark,
        tmp_path,
        JobHooks(fail_attempts=failing),
        **{"restart-strategy.fixed-delay.attempts": "1"},
    ).result
    assert result.status == "FAILED"
    assert result.message  # the FailJob reason names the restart strategy


# ---------------------------------------------------------------- pipelined regions (FLIP-119)


def pipelined_sales_job(data: Path, out: Path, parallelism: int, pipelined: tuple[str, ...]) -> Any:
    """sales -> score -> partial -partition_by-> final -> sink, with the forward edges into the
    vertices named in `pipelined` made PIPELINED and every vertex up to partial fixed at
    `parallelism` (a pipelined edge needs fixed ends)."""
    from tailguard.agent.graph.api import Job

    def into(dataset: Any, consumer: str) -> Any:
        return dataset.pipelined() if consumer in pipelined else dataset

    job = Job("pipelined-sales")
    sales = job.read_parquet(str(data), name="sales", parallelism=parallelism)
    scored = into(sales, "score").map(sales_by_region.score, name="score", parallelism=parallelism)
    partial = into(scored, "partial").map(
        sales_by_region.partial_sums, name="partial", parallelism=parallelism
    )
    totals = partial.partition_by("region").map(sales_by_region.final_sums, name="final")
    totals.write_parquet(str(out), name="sink")
    return job


def deploy_order(events: list[r.Event]) -> list[tuple[str, int, int]]:
    return [(e.vertex, e.subtask, e.attempt) for e in events if isinstance(e, r.AttemptDeploying)]


def deployed_together(events: list[r.Event], producer: tuple, consumer: tuple) -> bool:
    """The two attempts' AttemptDeploying are adjacent events, before either ended."""
    index = {}
    for k, e in enumerate(events):
        key = (getattr(e, "vertex", None), getattr(e, "subtask", None), getattr(e, "attempt", None))
        if isinstance(e, r.AttemptDeploying):
            index[("deploy", key)] = k
        elif isinstance(e, r.AttemptFinished | r.AttemptFailed | r.AttemptCanceled):
            index.setdefault(("end", key), k)
    first, second = index[("deploy", producer)], index[("deploy", consumer)]
    ends = [index.get(("end", producer), len(events)), index.get(("end", consumer), len(events))]
    return second == first + 1 and max(first, second) < min(ends)


def most_live(events: list[r.Event]) -> int:
    live: set[tuple] = set()
    most = 0
    for e in events:
        key = (getattr(e, "vertex", None), getattr(e, "subtask", None), getattr(e, "attempt", None))
        if isinstance(e, r.AttemptDeploying):
            live.add(key)
            most = max(most, len(live))
        elif isinstance(e, r.AttemptFinished | r.AttemptFailed | r.AttemptCanceled):
            live.discard(key)
    return most


def test_pipelined_source_and_map_are_deployed_together(
    tailguard_local_spark: Any, tmp_path: Path
) -> None:
    data = sales_by_region.generate(tmp_path / "sales", files=2, rows_per_file=2_000)
    out = tmp_path / "out"
    events: list[r.Event] = []
    job = pipelined_sales_job(data, out, parallelism=1, pipelined=("score",))
    job_run = run(job, tailguard_local_spark, tmp_path, JobHooks(on_event=events.append))

    assert_exact_sales(job_run, data)
    # The pipelined edge breaks the chain: sales | score→partial.
    assert deploy_order(events)[:2] == [("sales", 0, 0), ("score→partial", 0, 0)]
    assert deployed_together(events, ("sales", 0, 0), ("score→partial", 0, 0))


def test_regions_wait_for_enough_free_slots_without_deadlock(
    tailguard_local_spark: Any, tmp_path: Path
) -> None:
    # Two regions {sales→score#k, partial#k} of 2 tasks on 2 slots: a region is placed only
    # when both slots are free, one region at a time.
    data = sales_by_region.generate(tmp_path / "sales", files=2, rows_per_file=3_000)
    out = tmp_path / "out"
    events: list[r.Event] = []
    job = pipelined_sales_job(data, out, parallelism=2, pipelined=("partial",))
    job_run = run(job, tailguard_local_spark, tmp_path, JobHooks(on_event=events.append))

    assert_exact_sales(job_run, data)
    for k in range(2):
        assert deployed_together(events, ("sales→score", k, 0), ("partial", k, 0))
    assert most_live(events) <= 2


def test_a_failure_in_a_region_restarts_the_region_as_a_bulk(
    tailguard_local_spark: Any, tmp_path: Path
) -> None:
    data = sales_by_region.generate(tmp_path / "sales", files=2, rows_per_file=2_000)
    out = tmp_path / "out"
    events: list[r.Event] = []
    hooks = JobHooks(on_event=events.append, fail_attempts={("partial", 0, 0): "injected failure"})
    job = pipelined_sales_job(data, out, parallelism=1, pipelined=("partial",))
    job_run = run(job, tailguard_local_spark, tmp_path, hooks)

    assert_exact_sales(job_run, data)
    # The producer of the failed consumer is redone with it, in one bulk.
    assert deployed_together(events, ("sales→score", 0, 1), ("partial", 0, 1))
