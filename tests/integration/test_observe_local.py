"""`tailguard.observe` on the plugin's shared local[2] session: attached twice in one JVM (the
listener class is loaded once: py4j would call a second copy with the first's methods), each
observation archives the Spark jobs run while it was attached, and only those."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import tailguard
from tailguard.log.archive import ArchiveReader
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
