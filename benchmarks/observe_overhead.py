"""What observe mode costs the job it watches (`make bench-observe`; target: <= 2% job time).

    .venv/bin/python benchmarks/observe_overhead.py [--pairs 7] [--files 48] [--rows 200000]
        [--master local[2]] [--work-dir work/bench-observe]

An unmodified PySpark job (a groupBy aggregation over Parquet: `--files` files of `--rows` rows,
so one scan task per file, then the shuffle's reduce tasks) runs in one Spark session, plain and
under `tailguard.observe`, interleaved (plain/observed, then observed/plain, ...) so that drift
in the machine's load falls on both alike. Measured: the job's wall time, from the DataFrame
call to the collected result. Each observed run attaches the listener just before the job (its
relay process starts and imports tailguard meanwhile, as in the spark-submit form where it
starts with the application) and closes it after the job's time is taken (the relay's drain
after the job is not job time). The relay writes the application's archive only
(`tailguard.observe.log-mode=archive`): no broker needed, and what the job pays is the same,
since publishing runs in the relay's process, not the job's.

Printed: per contender the median and the spread (min-max) of the job time, the overhead of the
medians, the tasks per job (the listener's work is per task), the load average before and after
(`uptime`: other processes share the cores), and the median attach and close times apart.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def write_data(directory: Path, files: int, rows: int) -> Path:
    if directory.is_dir() and len(list(directory.glob("*.parquet"))) == files:
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    for n in range(files):
        table = pa.table(
            {"customer": rng.integers(0, 100_000, rows), "amount": rng.random(rows) * 100}
        )
        pq.write_table(table, directory / f"part-{n:03d}.parquet")
    return directory


def job(spark: Any, path: str) -> float:
    """The unmodified job; its wall time in seconds."""
    from pyspark.sql import functions as F

    started = time.perf_counter()
    totals = (
        spark.read.parquet(path)
        .groupBy("customer")
        .agg(F.sum("amount").alias("total"), F.count("*").alias("n"))
    )
    totals.agg(F.sum("total"), F.sum("n")).collect()
    return time.perf_counter() - started


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def spread(values: list[float]) -> str:
    median = statistics.median(values)
    return f"median {median:.3f} s (min {min(values):.3f}, max {max(values):.3f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--files", type=int, default=48)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--work-dir", default="work/bench-observe")
    args = parser.parse_args()
    if args.pairs < 1 or args.files < 1 or args.rows < 1:
        parser.error("--pairs, --files and --rows must be positive")

    from pyspark.sql import SparkSession

    import tailguard
    from tailguard.observer import listener_jar

    work = Path(args.work_dir).resolve()
    data = str(write_data(work / "data", args.files, args.rows))
    listener_jar()  # built once, before anything is timed
    spark = (
        SparkSession.builder.master(args.master)
        .appName("bench-observe")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    settings = {
        "tailguard.observe.log-mode": "archive",
        "tailguard.archive-dir": str(work / "archive"),
        "tailguard.work-dir": str(work),
    }
    tracker = spark.sparkContext.statusTracker()
    print(f"load before: {load()}")
    job(spark, data)  # warm-up: JIT, file listing caches, Python workers
    times: dict[str, list[float]] = {"plain": [], "observed": []}
    attach: list[float] = []
    close: list[float] = []
    tasks = 0
    for pair in range(args.pairs):
        order = ("plain", "observed") if pair % 2 == 0 else ("observed", "plain")
        for contender in order:
            if contender == "plain":
                times["plain"].append(job(spark, data))
                continue
            t0 = time.perf_counter()
            observation = tailguard.observe(spark, settings)
            attach.append(time.perf_counter() - t0)
            times["observed"].append(job(spark, data))
            t0 = time.perf_counter()
            status = observation.close()
            close.append(time.perf_counter() - t0)
            if status != 0:
                raise SystemExit(f"the relay exited with {status}")
        print(f"pair {pair + 1}: plain {times['plain'][-1]:.3f} s, observed "
              f"{times['observed'][-1]:.3f} s, load {load()}", flush=True)  # fmt: skip
    for job_id in tracker.getJobIdsForGroup(None)[-2:]:
        info = tracker.getJobInfo(job_id)
        if info is not None:
            tasks += sum(tracker.getStageInfo(s).numTasks for s in info.stageIds)
    spark.stop()
    plain, observed = (statistics.median(times[c]) for c in ("plain", "observed"))
    print(f"tasks per job: ~{tasks} (the last Spark jobs of one run)")
    print(f"plain:    {spread(times['plain'])}")
    print(f"observed: {spread(times['observed'])}")
    print(f"overhead of the medians: {100 * (observed / plain - 1):+.1f}% (target <= 2%)")
    print(f"attach {statistics.median(attach):.3f} s, close {statistics.median(close):.3f} s "
          "(medians; neither is job time)")  # fmt: skip
    print(f"load after: {load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
