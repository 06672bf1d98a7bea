"""A session built the usual way whose executors run a Python without tailguard: the job fails
at once, before any attempt, with a message that names the fix (issue 10). And a job whose own
code cannot be imported on the executors fails at its first failure, without restarts.

Before the check, every runner died unpickling its task (`No module named 'tailguard'`) and the
job failed only when the runners' start timeout ran out (60 s on local[2]; in an older version
every attempt failed as INFRA and was restarted 11 times over ~3 minutes).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tailguard.agent.graph.api import Job
from tailguard.examples import sales_by_region
from tailguard.model import records as r
from tailguard.model.config import Settings
from tailguard.replay.inputs import read_archive
from tailguard.testing import Harness

pytestmark = pytest.mark.spark  # skipped with the reason where no JDK is found (conftest)


def test_executors_without_tailguard_fail_the_job_at_once(
    tailguard_harness: Harness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyspark.sql import SparkSession

    from tailguard.agent.entry import run

    # The same Python as the driver's, in a venv of its own: everything but tailguard (and no
    # PYTHONPATH of the run's, which could name a source tree with tailguard in it).
    monkeypatch.delenv("PYTHONPATH", raising=False)
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
    # A session of its own, built the usual way: the plugin's must stop first (one per process).
    tailguard_harness.release_spark()
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


def defined_here(table: Any) -> Any:
    """Pickled by reference to this test module, which the executors' Python cannot import."""
    return table


def test_an_import_error_of_the_jobs_code_fails_the_job_without_a_restart(
    tailguard_local_spark: Any, tmp_path: Path
) -> None:
    """The executors run tailguard, but the job's own code needs a module they lack, either to
    load the operator or when it runs: the first failure ends the job (the restart strategy
    would retry it 3 times, to the same end)."""
    from tailguard.agent.entry import run

    data = sales_by_region.generate(tmp_path / "data", files=1, rows_per_file=200)
    settings = Settings(
        {
            "tailguard.work-dir": str(tmp_path / "work"),
            "tailguard.archive-dir": str(tmp_path),
            "restart-strategy.type": "fixed-delay",
            "restart-strategy.fixed-delay.attempts": "3",
            "restart-strategy.fixed-delay.delay": "0 ms",
        }
    )
    operators = {
        # A lambda travels by value; the module it imports is missing when it runs.
        "tailguard_no_such_module": lambda t: __import__("tailguard_no_such_module") and t,
        "cannot load the attempt: ModuleNotFoundError": defined_here,
    }
    # `tailguard.run` itself, not the plugin's `run_job`: that would ship this module by value,
    # and the point is what happens when the executors cannot import it.
    for n, (expected, operator) in enumerate(operators.items()):
        job = Job(f"needs-a-module-{n}")
        job.read_parquet(str(data), name="sales").map(operator, name="use").write_parquet(
            str(tmp_path / f"out{n}"), name="sink"
        )
        result = run(
            job,
            tailguard_local_spark,
            log_mode="archive",
            services=False,
            settings=settings,
            progress=False,
        )
        assert not result.ok
        assert "not recoverable" in result.message and expected in result.message
        log = [item.record for item in read_archive(Path(result.archive), settings)]
        failed = [x for x in log if isinstance(x, r.AttemptFailed)]
        assert failed and all(f.non_recoverable for f in failed)
        assert not any(isinstance(x, r.RestartTasks) for x in log)
        # Only the attempts deployed before the first failure ran: none was a restart.
        assert {x.attempt for x in log if isinstance(x, r.AttemptDeploying)} == {0}
