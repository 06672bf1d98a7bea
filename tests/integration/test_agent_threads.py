"""Two jobs in one driver process: a thread that dies while working for one of them fails that
job, and the other still succeeds (issue 28, item 4). The Spark session is the plugin's shared
local[2] one; both jobs keep their log in the archive (no broker is involved).

On local[2] the first job's slot runners hold both cores, so the second job waits in its
executor check until the first ends: it is running (its JobSubmitted is out) when the first
job's thread dies, and its first messages come after that death."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from tailguard.agent.adapters.spark import SparkRuntime
from tailguard.agent.driver.driver import JobDriver
from tailguard.agent.driver.hooks import JobHooks
from tailguard.agent.driver.result import RunResult
from tailguard.agent.entry import run
from tailguard.agent.graph.api import Job
from tailguard.examples import sales_by_region
from tailguard.model import records as r
from tailguard.model.config import Settings
from tailguard.testing import ship_job_code

pytestmark = pytest.mark.spark

WAIT_S = 120.0


class ConnectionTableCorrupt(RuntimeError):
    pass


def small_job(tmp: Path, name: str) -> Job:
    data = sales_by_region.generate(tmp / f"sales-{name}", files=2, rows_per_file=1_000)
    job = sales_by_region.make_job(data, tmp / f"out-{name}")
    ship_job_code(job)
    return job


def test_a_dying_thread_fails_its_own_job_only(tailguard_local_spark: Any, tmp_path: Path) -> None:
    settings = Settings(
        {"tailguard.work-dir": str(tmp_path / "work"), "tailguard.archive-dir": str(tmp_path / "a")}
    )
    first_holds_cores = threading.Event()
    second_submitted = threading.Event()
    results: dict[str, RunResult | BaseException] = {}

    def die() -> None:
        raise ConnectionTableCorrupt("connection table corrupt")

    def kill_a_thread_of_the_first(driver: JobDriver) -> None:
        first_holds_cores.set()
        assert second_submitted.wait(WAIT_S), "the second job never started"
        runtime = driver.runtime
        assert isinstance(runtime, SparkRuntime)
        runtime.start_thread(die, name="tg-runner-conn")  # one of the first job's own threads

    def second_started(event: r.Event) -> None:
        if isinstance(event, r.JobSubmitted):
            second_submitted.set()

    def run_one(name: str, hooks: JobHooks) -> None:
        try:
            results[name] = run(
                small_job(tmp_path, name),
                tailguard_local_spark,
                log_mode="archive",
                services=False,
                settings=settings,
                progress=False,
                hooks=hooks,
            )
        except BaseException as err:  # the test reports it below
            results[name] = err

    first = threading.Thread(
        target=run_one, args=("first", JobHooks(on_start=kill_a_thread_of_the_first))
    )
    second = threading.Thread(target=run_one, args=("second", JobHooks(on_event=second_started)))
    first.start()
    try:
        # The second starts once the first holds the cores, so it is the one that waits.
        assert first_holds_cores.wait(WAIT_S), "the first job's runners never connected"
        second.start()
    finally:
        first.join(WAIT_S)
        if second.ident is not None:  # started
            second.join(WAIT_S)

    failed, survived = results["first"], results["second"]
    assert isinstance(failed, RunResult), failed
    assert isinstance(survived, RunResult), survived
    assert r.JobStatus(failed.status) == r.JobStatus.FAILED
    assert "agent thread tg-runner-conn died" in failed.message
    assert "connection table corrupt" in failed.message
    assert r.JobStatus(survived.status) == r.JobStatus.SUCCEEDED, survived.summary()
