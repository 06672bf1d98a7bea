"""The plain PySpark applications the spark-submit tests submit (no tailguard in their code),
and the submission itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from tailguard.archive import ArchiveReader
from tailguard.model import records as r
from tailguard.observer.query_plans import PLAN_VERTEX, shuffle_vertex
from tailguard.observer.translate import is_plan_job, observed_job_id

SUBMITTED_JOB = """
from pyspark.sql import SparkSession, functions as F

spark = SparkSession.builder.appName("plain-job").getOrCreate()
spark.range(0, 100_000).withColumn("k", F.col("id") % 7).groupBy("k").agg(F.sum("id")).collect()
spark.stop()
"""

# A groupBy, then a sort-merge join of its result with a second shuffled table, then a groupBy:
# three query stages that read shuffles Spark coalesces (the join's two sides as one). Prints its
# result as one JSON line. Before it, a warm-up groupBy left out (tailguard.ignore, set as a Scala
# or Java application would): its shuffle is the application's first, shuffle 0.
PLANNED_JOB = """
import json
from pyspark.sql import SparkSession, functions as F

spark = SparkSession.builder.appName("planned-job").getOrCreate()
sc = spark.sparkContext
sc.setJobGroup("warm-up", "warm-up")
sc.setLocalProperty("tailguard.ignore", "true")
spark.range(0, 10_000, 1, 4).groupBy((F.col("id") % 11).alias("k")).count().collect()
sc.setLocalProperty("tailguard.ignore", None)
sc.setLocalProperty("spark.jobGroup.id", None)
print("IGNORED " + json.dumps(list(sc.statusTracker().getJobIdsForGroup("warm-up"))))
orders = spark.range(0, {rows}, 1, 4).select(
    (F.col("id") % {customers}).alias("customer"), (F.col("id") % 97).alias("amount"))
totals = orders.groupBy("customer").agg(F.sum("amount").alias("total"))
customers = spark.range(0, {customers}, 1, 4).select(
    F.col("id").alias("customer"), (F.col("id") % 13).alias("segment"))
segments = (totals.join(customers, "customer").groupBy("segment")
            .agg(F.sum("total").alias("total"), F.count("*").alias("n")))
rows = sorted((r["segment"], r["total"], r["n"]) for r in segments.collect())
print("RESULT " + json.dumps(rows))
spark.stop()
"""


def planned_job(rows: int, customers: int) -> str:
    return PLANNED_JOB.format(rows=rows, customers=customers)


def planned_result(rows: int, customers: int) -> list[list[int]]:
    """What PLANNED_JOB prints, computed without Spark."""
    totals = [0] * customers
    for i in range(rows):
        totals[i % customers] += i % 97
    out: dict[int, list[int]] = {}
    for customer, total in enumerate(totals):
        seg = out.setdefault(customer % 13, [customer % 13, 0, 0])
        seg[1] += total
        seg[2] += 1
    return sorted(out.values())


def spark_submit(
    job: str, tmp_path: Path, conf: Mapping[str, str], master: str = "local[2]"
) -> subprocess.CompletedProcess[str]:
    """`spark-submit` of the application `job` with `conf` (`spark.jars` as `--jars`), from
    `tmp_path`; its output captured."""
    script = tmp_path / "job.py"
    script.write_text(job)
    conf = dict(conf)
    jars = conf.pop("spark.jars", "")
    args = [a for k, v in conf.items() for a in ("--conf", f"{k}={v}")]
    return subprocess.run(
        [
            str(Path(sys.executable).parent / "spark-submit"),
            "--master", master,
            *(("--jars", jars) if jars else ()),
            "--conf", "spark.ui.enabled=false",
            *args,
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=tmp_path,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )  # fmt: skip


def assert_planned(
    done: subprocess.CompletedProcess[str], tmp_path: Path, rows: int, customers: int
) -> Path:
    """PLANNED_JOB ran with its query stages planned by the decider: the result is exact; each
    stage that read a coalesced shuffle (the groupBy's reduce, the join with both sides in one
    request, the last groupBy) has a plan job in the archive, decided and applied; and each
    ran as many tasks as the decision said. The warm-up left out is in the archive neither as
    a job nor as a plan. Returns the archive."""
    assert done.returncode == 0, done.stderr[-3000:]
    [result] = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert json.loads(result[len("RESULT ") :]) == planned_result(rows, customers)
    [ignored] = [line for line in done.stdout.splitlines() if line.startswith("IGNORED ")]
    [archive] = (tmp_path / "archive").glob("*.avro")
    records = [e.record for e in ArchiveReader(archive)]
    left_out = {observed_job_id(archive.stem, j) for j in json.loads(ignored[len("IGNORED ") :])}
    published = {x.job_id for x in records if isinstance(x, r.JobSubmitted)}
    assert left_out and not left_out & published, (left_out, published)
    assert not any(
        v.name == shuffle_vertex(0)
        for x in records
        if isinstance(x, r.JobSubmitted) and is_plan_job(x.job_id)
        for v in x.graph.vertices
    ), "the left-out warm-up's shuffle was planned"
    plans = {
        x.job_id: x for x in records if isinstance(x, r.JobSubmitted) and is_plan_job(x.job_id)
    }
    decisions = {
        x.job_id: x
        for x in records
        if isinstance(x, r.SetParallelism) and x.job_id in plans and x.vertex == PLAN_VERTEX
    }
    applied = {x.command_id for x in records if isinstance(x, r.CommandApplied)}
    ended = {x.job_id: x for x in records if isinstance(x, r.JobFinished) and x.job_id in plans}
    summary = f"plans {sorted(plans)}; decisions {decisions}; ended {ended}"
    assert len(plans) >= 2 and set(decisions) == set(plans), summary
    assert any(len(p.graph.edges) == 2 for p in plans.values()), "no plan read a join's sides"
    for job_id, decision in decisions.items():
        assert decision.id in applied, summary
        assert ended[job_id].status is r.JobStatus.SUCCEEDED, summary
    # The task counts of the stages that read a shuffle, in the observed Spark jobs: each
    # planned stage ran the decided number, and none Spark's 200 shuffle partitions.
    ran = [
        v.parallelism or 0
        for x in records
        if isinstance(x, r.JobSubmitted) and x.job_id not in plans
        for v in x.graph.vertices
        if v.name in {e.target for e in x.graph.edges}
    ]
    for decision in decisions.values():
        assert decision.parallelism in ran, (decision.parallelism, ran)
    assert 200 not in ran, ran
    # The reader's floor is Spark's own coalescing's: no more than one task per
    # minPartitionSize (1 MiB) of shuffled bytes, so the small last groupBy may run as one task.
    shuffled: dict[str, int] = {}
    for x in records:
        if isinstance(x, r.AttemptFinished) and x.job_id in plans:
            shuffled[x.job_id] = shuffled.get(x.job_id, 0) + x.input_bytes
    floors = {
        job_id: (v.min_parallelism, shuffled[job_id])
        for job_id, plan in plans.items()
        for v in plan.graph.vertices
        if v.name == PLAN_VERTEX
    }
    for floor, total in floors.values():
        assert floor is not None and floor <= max(1, -(-total // (1 << 20))), floors
    assert any(floor == 1 and total < 1 << 20 for floor, total in floors.values()), floors
    return archive
