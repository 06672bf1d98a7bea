"""Attempts as Spark jobs: one job per attempt, pinned to its host, in its own job group.

Spark keeps doing what it is good at (executors, Python workers, JVM fault detection); its own
task retries and speculation are off for these jobs, because the control plane owns both.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pyspark import SparkContext
from pyspark.sql import SparkSession

from tailguard.agent.driver.driver import Runtime
from tailguard.agent.executor.attempt import TaskSpec, request_cancel, run_attempt
from tailguard.cluster.pinning import pinned_rdd

log = logging.getLogger("tailguard.agent.spark")

# What an attempt job needs from the session; set when the session is built by tailguard, and
# checked (with a warning) when the user brings their own.
REQUIRED_CONF = {
    "spark.task.maxFailures": "1",
    "spark.speculation": "false",
    "spark.locality.wait": "1h",
}


def session_builder(master: str, app_name: str = "tailguard") -> SparkSession.Builder:
    """A SparkSession builder with the settings attempt jobs rely on."""
    builder = SparkSession.builder.master(master).appName(app_name)
    # Executors must run the tasks with this interpreter: it is the one with tailguard installed.
    # PySpark 4 takes the executors' Python from the driver's environment.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = builder.config("spark.pyspark.python", sys.executable)
    for key, value in REQUIRED_CONF.items():
        builder = builder.config(key, value)
    if not master.startswith("local"):
        builder = builder.config("spark.driver.host", "127.0.0.1").config(
            "spark.driver.bindAddress", "127.0.0.1"
        )
    return builder.config("spark.ui.enabled", "false").config(
        "spark.ui.showConsoleProgress", "false"
    )


class SparkRuntime(Runtime):
    def __init__(self, spark: SparkSession, max_threads: int = 64) -> None:
        self.sc: SparkContext = spark.sparkContext
        self.local = self.sc.master.startswith("local")
        for key, value in REQUIRED_CONF.items():
            actual = self.sc.getConf().get(key)
            if actual != value:
                log.warning("Spark setting %s is %r; tailguard expects %r", key, actual, value)
        self._pool = ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="tg-attempt")
        self._lock = threading.Lock()
        # key -> (job group, spec) of each attempt whose Spark job has not ended yet
        self._running: dict[tuple[str, int, int], tuple[str, Any]] = {}

    # ---------------------------------------------------------------- cluster view

    def executors(self) -> dict[str, int]:
        if self.local:
            return {"localhost": self.sc.defaultParallelism}
        hosts: dict[str, int] = {}
        summaries = self.sc._jsc.sc().statusStore().executorList(True)
        for i in range(summaries.size()):
            summary = summaries.apply(i)
            if summary.id() == "driver" or not summary.isActive():
                continue
            host = summary.hostPort().rsplit(":", 1)[0]
            hosts[host] = hosts.get(host, 0) + int(summary.totalCores())
        return hosts

    # ---------------------------------------------------------------- attempts

    def submit(
        self, key: tuple[str, int, int], host: str, payload: Any, done: Callable[[Any], None]
    ) -> None:
        group = f"tg:{key[0]}:{key[1]}:{key[2]}:{id(payload)}"
        with self._lock:
            self._running[key] = (group, payload)

        def run() -> None:
            try:
                self.sc.setJobGroup(group, f"tailguard {key[0]}#{key[1]} attempt {key[2]}", True)
                if self.local:
                    rdd = self.sc.parallelize([payload], 1)
                else:
                    rdd = pinned_rdd(self.sc, [(payload, host)])
                outcome = rdd.map(run_attempt).collect()[0]
            except Exception as err:  # the Spark job failed or was cancelled
                outcome = err
            finally:
                with self._lock:
                    self._running.pop(key, None)
            done(outcome)

        self._pool.submit(run)

    def cancel(self, key: tuple[str, int, int]) -> None:
        with self._lock:
            running = self._running.get(key)
        if running is None:
            return
        group, spec = running
        self.sc.cancelJobGroup(group)
        if isinstance(spec, TaskSpec):
            try:
                request_cancel(spec)
            except OSError as err:
                # Spark's own (slower) kill of the Python worker still ends the attempt.
                log.warning("cannot write the cancel marker of %s: %s", key, err)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
