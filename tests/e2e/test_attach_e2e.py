"""End to end, attach mode (issue 23's acceptance): an unmodified PySpark DataFrame job, Parquet ->
`mapInPandas` whose work scales with its host's slowness -> `groupBy().agg` -> Parquet, runs
under `tailguard.attach` on the 3-worker cluster with one host really slow (I/O mode) and the
five services on. The speculator's command starts a copy on another host inside Spark's
scheduler and the copy wins; the blocklist's command keeps new tasks off the slow host while it
is blocked; the output is exact; the replay of the application's archive shows no difference.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tests.e2e.submitted_job import (
    SUBMITTED_JOB,
    assert_planned,
    planned_job,
    spark_submit,
)

import tailguard
from tailguard.archive import ArchiveReader
from tailguard.model import records as r
from tailguard.observer.translate import is_plan_job
from tailguard.replay.engine import replay
from tailguard.replay.inputs import read_archive
from tailguard.testing import Harness, run_settings

SLOW_HOST = "127.0.0.4"
TASK_S = 4.0  # each scan task's I/O-bound work on a healthy host
FILES = 12
ATTACH_POLICY = {
    "slow-task-detector.check-interval": "250 ms",
    "slow-task-detector.execution-time.baseline-lower-bound": "1 s",
    "execution.batch.speculative.block-slow-node-duration": "60 s",
    "blocklist.min-slow-attempts": "1",
}
SPARK_CONF = {
    # One scan task per file, as a submission would ask: a slow host then gets whole tasks.
    "spark.sql.files.openCostInBytes": str(256 << 20),
    "spark.locality.wait": "0",
    "spark.sql.shuffle.partitions": "6",
}

# Minutes on 2 cores (a 3-worker cluster, the services, a job with a slow host): `make
# test-attach` runs it; the default suite has the local[2] test (test_attach_local.py).
pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("TAILGUARD_ATTACH_E2E") != "1",
        reason="attach mode end to end: make test-attach (TAILGUARD_ATTACH_E2E=1)",
    ),
]


def write_sales(directory: Path) -> Path:
    directory.mkdir(parents=True)
    rng = np.random.default_rng(23)
    for n in range(FILES):
        table = pa.table(
            {"region": rng.integers(0, 40, 2_000), "amount": rng.integers(0, 1_000, 2_000)}
        )
        pq.write_table(table, directory / f"part-{n:03d}.parquet")
    return directory


def region_totals(spark: Any, source: str, target: str) -> None:
    """The job as a team runs it today: plain PySpark, no tailguard in it."""
    from pyspark.sql import functions as F

    task_s = TASK_S

    # Defined here, so it travels by value: the executors cannot import this test module.
    def scan(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        """The job's own map step: I/O-bound work, slower on a slow host (I/O mode)."""
        from tailguard.cluster.slowness import io_work

        io_work(task_s)
        yield from batches

    sales = spark.read.parquet(source).mapInPandas(scan, "region long, amount long")
    totals = sales.groupBy("region").agg(F.sum("amount").alias("total"), F.count("*").alias("n"))
    totals.write.mode("overwrite").parquet(target)


def expected(source: Path) -> pd.DataFrame:
    frame = pq.read_table(source).to_pandas()
    grouped = frame.groupby("region").agg(total=("amount", "sum"), n=("amount", "size"))
    return grouped.reset_index().sort_values("region").reset_index(drop=True)


@pytest.mark.tailguard_cluster(workers=3, slow={SLOW_HOST: 10}, slow_mode="io")
@pytest.mark.tailguard_spark(conf=SPARK_CONF)
@pytest.mark.tailguard_services(settings=ATTACH_POLICY)
def test_an_unmodified_job_gets_a_winning_copy_and_its_slow_host_blocked(
    tailguard_harness: Harness, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    node = request.node
    source = write_sales(tmp_path / "sales")
    spark = tailguard_harness.spark_of(node)
    services = tailguard_harness.services_of(node)
    settings = run_settings(tmp_path, services, ATTACH_POLICY)
    with tailguard_harness.slow_hosts_of(node):
        attachment = tailguard.attach(spark, settings)
        started = time.monotonic()
        region_totals(spark, str(source), str(tmp_path / "out"))
        took = time.monotonic() - started
        assert attachment.close() == 0

    got = pq.read_table(tmp_path / "out").to_pandas()
    got = got.sort_values("region").reset_index(drop=True)[["region", "total", "n"]]
    pd.testing.assert_frame_equal(got, expected(source), check_dtype=False)

    archive = tmp_path / "archive" / f"{attachment.app_id}.avro"
    recorded = list(read_archive(archive, services.settings))
    events = [e.record for e in recorded if e.topic == r.EVENTS_TOPIC]
    applied = {e.command_id: e for e in events if isinstance(e, r.CommandApplied)}
    rejected = {e.command_id: e.reason for e in events if isinstance(e, r.CommandRejected)}
    commands = [e.record for e in recorded if isinstance(e.record, r.Command)]
    summary = f"job {took:.1f} s; applied {sorted(applied)}; rejected {rejected}"

    # The speculator's copy ran on another host and won.
    copies = [c for c in commands if isinstance(c, r.LaunchSpeculativeAttempts)]
    assert any(c.id in applied for c in copies), summary
    deployed = [e for e in events if isinstance(e, r.AttemptDeploying)]
    won = {
        (e.job_id, e.vertex, e.subtask, e.attempt)
        for e in events
        if isinstance(e, r.AttemptFinished)
    }
    winning_copies = [
        e
        for e in deployed
        if e.speculative and e.host != SLOW_HOST
        and (e.job_id, e.vertex, e.subtask, e.attempt) in won
    ]  # fmt: skip
    assert winning_copies, summary
    lost = [
        e
        for e in events
        if isinstance(e, r.AttemptCanceled)
        and e.reason is r.CancelReason.LOST_RACE
        and e.host == SLOW_HOST
    ]
    assert lost, summary

    # The slow host was blocked for the application, and got no new task while blocked.
    blocks = [c for c in commands if isinstance(c, r.BlockNodes) and c.id in applied]
    assert any(SLOW_HOST in c.hosts for c in blocks), summary
    blocked_at = min(e.ts for e in events if isinstance(e, r.NodeBlocked) and e.host == SLOW_HOST)
    unblocked = [e.ts for e in events if isinstance(e, r.NodeUnblocked) and e.host == SLOW_HOST]
    until = min(unblocked) if unblocked else float("inf")
    late = [e for e in deployed if e.host == SLOW_HOST and blocked_at < e.ts < until]
    assert not late, f"tasks started on the blocked host: {late}"

    report = replay(read_archive(archive, services.settings), services.settings)
    assert report.differences == 0, [s.line() for s in report.services] + report.notes(10)


@pytest.mark.tailguard_cluster(workers=3)
@pytest.mark.tailguard_services(settings=ATTACH_POLICY)
def test_the_deciders_ranges_plan_a_submitted_jobs_groupby_and_join_on_the_cluster(
    tailguard_harness: Harness, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """SetParallelism on the cluster: the query stages of an unmodified application submitted to
    the standalone master read the decider's ranges (both sides of the join one set), the
    result is exact, and the replay of its archive shows no difference."""
    node = request.node
    cluster = tailguard_harness.cluster_of(node)
    services = tailguard_harness.services_of(node)
    conf = tailguard.spark_conf(run_settings(tmp_path, services, ATTACH_POLICY).overrides())
    conf["spark.sql.autoBroadcastJoinThreshold"] = "-1"  # a sort-merge join: both sides shuffled
    # The workers listen on loopback addresses: the driver must be reachable there too.
    conf["spark.driver.host"] = conf["spark.driver.bindAddress"] = "127.0.0.1"
    rows, customers = 2_000_000, 50_000
    # The submitted application needs the workers' cores: a harness session an earlier test
    # left on the same cluster would hold them, and the application would wait for executors.
    tailguard_harness.release_spark()
    done = spark_submit(planned_job(rows, customers), tmp_path, conf, master=cluster.master_url)
    archive = assert_planned(done, tmp_path, rows, customers)
    report = replay(read_archive(archive, services.settings), services.settings)
    assert report.differences == 0, [s.line() for s in report.services] + report.notes(10)


def test_the_spark_submit_form_attaches_with_no_code_in_the_job(
    tailguard_broker: Any, tmp_path: Path
) -> None:
    """`--jars` + `spark.plugins` + `spark.tailguard.*` settings (what `tailguard.spark_conf()`
    returns): the plugin attaches the application from its start, the actuator answers the
    relay through the pipe, and everything is archived when spark-submit returns."""
    conf = tailguard.spark_conf(
        {
            "bootstrap.servers": tailguard_broker.bootstrap,
            "tailguard.archive-dir": str(tmp_path / "archive"),
            "tailguard.work-dir": str(tmp_path / "work"),
        }
    )
    done = spark_submit(SUBMITTED_JOB, tmp_path, conf)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (
        "attach: the actuator applies BlockNodes, FailJob, LaunchSpeculativeAttempts, "
        "RestartTasks, SetParallelism" in done.stderr
    ), done.stderr[-3000:]
    [archive] = (tmp_path / "archive").glob("*.avro")
    records = [e.record for e in ArchiveReader(archive)]
    # The Spark jobs, not the query-stage plans the decider was asked about.
    submitted = [x for x in records if isinstance(x, r.JobSubmitted) and not is_plan_job(x.job_id)]
    assert submitted and all(x.name.startswith("plain-job (Spark job") for x in submitted)
    ended = [x for x in records if isinstance(x, r.JobFinished) and not is_plan_job(x.job_id)]
    assert len(ended) == len(submitted)
