"""`tailguard.observe` on the plugin's shared local[2] session: attached twice in one JVM (the
listener class is loaded once: py4j would call a second copy with the first's methods), each
observation archives the Spark jobs run while it was attached, and only those."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import tailguard
from tailguard.archive import ArchiveReader
from tailguard.model import records as r

pytestmark = [pytest.mark.spark]


def _job(spark: Any) -> None:
    from pyspark.sql import functions as F

    spark.range(0, 5_000, numPartitions=3).groupBy((F.col("id") % 3).alias("k")).count().collect()


def test_two_observations_in_one_jvm_each_archive_their_jobs(
    tailguard_local_spark: Any, tmp_path: Path
) -> None:
    spark = tailguard_local_spark
    seen: list[set[str]] = []
    for n in range(2):
        archive_dir = tmp_path / f"archive-{n}"
        observation = tailguard.observe(
            spark,
            {"tailguard.observe.log-mode": "archive", "tailguard.archive-dir": str(archive_dir)},
        )
        _job(spark)
        assert observation.close() == 0
        records = [e.record for e in ArchiveReader(archive_dir / f"{observation.app_id}.avro")]
        jobs = {x.job_id for x in records if isinstance(x, r.JobSubmitted)}
        finished = {x.job_id for x in records if isinstance(x, r.JobFinished)}
        assert jobs and jobs == finished
        assert any(isinstance(x, r.AttemptFinished) and x.input_bytes for x in records)
        seen.append(jobs)
    # The second observation holds the later Spark jobs only.
    assert not seen[0] & seen[1]
    _job(spark)  # a job after close() is no one's: the listener was removed


def test_jobs_run_while_paused_are_not_observed(tailguard_local_spark: Any, tmp_path: Path) -> None:
    # What `make bench-observe-within` relies on: its "plain" jobs (paused) are really
    # unobserved, and the observed ones around them are whole.
    from tailguard.observer.translate import observed_job_id

    spark = tailguard_local_spark
    sc = spark.sparkContext
    observation = tailguard.observe(
        spark, {"tailguard.observe.log-mode": "archive", "tailguard.archive-dir": str(tmp_path)}
    )
    groups = ("before", "paused", "after")
    for group in groups:
        if group == "paused":
            observation.pause()
        elif group == "after":
            observation.resume()
        sc.setJobGroup(group, group)
        _job(spark)
    sc.setLocalProperty("spark.jobGroup.id", None)  # the session is shared
    sc.setLocalProperty("spark.job.description", None)
    assert observation.close() == 0

    spark_jobs = {g: set(sc.statusTracker().getJobIdsForGroup(g)) for g in groups}
    assert all(spark_jobs.values())
    records = [e.record for e in ArchiveReader(tmp_path / f"{observation.app_id}.avro")]
    jobs = {x.job_id for x in records if isinstance(x, r.JobSubmitted)}
    finished = {x.job_id for x in records if isinstance(x, r.JobFinished)}
    expected = {
        observed_job_id(observation.app_id, j) for g in ("before", "after") for j in spark_jobs[g]
    }
    assert jobs == finished == expected


def test_jobs_started_while_ignoring_are_left_out(
    tailguard_local_spark: Any, tmp_path: Path
) -> None:
    # A warm-up or a probe inside `ignoring()` (the local property tailguard.ignore) is not
    # published, while the jobs around it, and a job another thread runs meanwhile, are whole:
    # like every Spark local property, it holds for the thread that set it. (Group names of
    # their own: the session, and its status tracker, are shared with the tests above.)
    import threading

    from tailguard.observer.translate import observed_job_id

    spark = tailguard_local_spark
    sc = spark.sparkContext
    observation = tailguard.observe(
        spark, {"tailguard.observe.log-mode": "archive", "tailguard.archive-dir": str(tmp_path)}
    )

    def elsewhere() -> None:
        sc.setJobGroup("i-elsewhere", "i-elsewhere")
        _job(spark)

    try:
        sc.setJobGroup("i-before", "i-before")
        _job(spark)
        with observation.ignoring():
            sc.setJobGroup("i-ignored", "i-ignored")
            _job(spark)
            assert sc.getLocalProperty("tailguard.ignore") == "true"
            thread = threading.Thread(target=elsewhere)
            thread.start()
            thread.join()
        assert sc.getLocalProperty("tailguard.ignore") is None
        sc.setJobGroup("i-after", "i-after")
        _job(spark)
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)  # the session is shared
        sc.setLocalProperty("spark.job.description", None)
    assert observation.close() == 0

    groups = ("i-before", "i-ignored", "i-after", "i-elsewhere")
    spark_jobs = {g: set(sc.statusTracker().getJobIdsForGroup(g)) for g in groups}
    assert all(spark_jobs.values()), spark_jobs
    records = [e.record for e in ArchiveReader(tmp_path / f"{observation.app_id}.avro")]
    jobs = {x.job_id for x in records if isinstance(x, r.JobSubmitted)}
    finished = {x.job_id for x in records if isinstance(x, r.JobFinished)}
    expected = {
        observed_job_id(observation.app_id, j)
        for g in ("i-before", "i-after", "i-elsewhere")
        for j in spark_jobs[g]
    }
    assert jobs == finished == expected
    # Nothing of the ignored jobs' tasks either: every attempt belongs to a published job.
    attempts = {x.job_id for x in records if isinstance(x, r.AttemptDeploying | r.AttemptFinished)}
    assert attempts <= expected and attempts
