"""A session built the usual way whose executors run a Python without tailguard: the job fails
at once, before any attempt, with a message that names the fix (issue 10).

Before the check, every runner died unpickling its task (`No module named 'tailguard'`) and the
job failed only when the runners' start timeout ran out (60 s on local[2]; in an older version
every attempt failed as INFRA and was restarted 11 times over ~3 minutes).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tailguard.examples import sales_by_region
from tailguard.model import records as r
from tailguard.model.config import Settings
from tailguard.replay.inputs import read_archive

pytestmark = pytest.mark.spark  # skipped with the reason where no JDK is found (conftest)


def test_executors_without_tailguard_fail_the_job_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyspark.sql import SparkSession

    from tailguard.agent.entry import run

    # The same Python as the driver's, in a venv of its own: everything but tailguard.
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    python = bare / "bin" / "python"
    missing = subprocess.run([str(python), "-c", "import tailguard"], capture_output=True)
    assert missing.returncode != 0, "the bare venv must lack tailguard"

    data = sales_by_region.generate(tmp_path / "data", files=2, rows_per_file=500)
    job = sales_by_region.make_job(data, tmp_path / "out")
    settings = Settings(
        {"tailguard.work-dir": str(tmp_path / "work"), "tailguard.archive-dir": str(tmp_path)}
    )
    # What a user's environment does: PySpark starts the executors' Python from PYSPARK_PYTHON.
    monkeypatch.setenv("PYSPARK_PYTHON", str(python))
    spark = SparkSession.builder.master("local[2]").appName("tailguard-no-env").getOrCreate()
    try:
        started = time.monotonic()
        result = run(
            job, spark, log_mode="archive", services=False, settings=settings, progress=False
        )
        took = time.monotonic() - started
    finally:
        spark.stop()
    print(f"failed after {took:.1f} s: {result.message}")
    assert not result.ok
    assert f"(python {python} " in result.message
    assert "No module named 'tailguard'" in result.message
    assert "spark.archives" in result.message and "docs/deploy.md" in result.message
    assert result.attempts == ()
    log = [item.record for item in read_archive(Path(result.archive), settings)]
    assert not any(isinstance(x, r.AttemptDeploying | r.NodeAdded) for x in log)
    (finished,) = [x for x in log if isinstance(x, r.JobFinished)]
    assert finished.status is r.JobStatus.FAILED and finished.message == result.message
