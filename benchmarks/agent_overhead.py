"""Dispatch overhead of the slot runners on a Spark standalone cluster (`make bench-agent`).

    .venv/bin/python benchmarks/agent_overhead.py [--master spark://HOST:PORT] [--workers 3]
        [--attempts 120] [--jobs 3]

Without `--master` it starts its own local cluster (`--workers` workers, 1 core each) and stops
it at the end. It runs `--jobs` jobs of `--attempts` trivial attempts each (a source of that
many one-row-group splits chained with an identity map and a Parquet sink: one attempt per
split, nothing to compute) through the public entry, `tailguard.run(job, spark)`, without
services, and reads per attempt what the driver measured (`RunResult`):

- dispatch: the deploy -> outcome round trip minus the run time the runner measured, i.e. what
  the agent adds to every attempt (serialising, the connection, the runner's loop);
- deploy -> running: from the deploy message sent to the runner's "running" report.

The first job warms the runners' Python workers up and is left out. The first line of output
is `dispatch p50 N ms p99 N ms`; details and the targets follow. Asserts nothing: timings depend
on the machine and its load. Result-partition throughput is `benchmarks/exchange_throughput.py`.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tailguard.bench import report
from tailguard.model.percentile import percentile


def identity(table: pa.Table) -> pa.Table:
    return table


def generate(path: Path, splits: int) -> Path:
    """`splits` one-row-group Parquet files of one row each."""
    path.mkdir(parents=True, exist_ok=True)
    for i in range(splits):
        pq.write_table(pa.table({"x": [i]}), path / f"part-{i:05d}.parquet")
    return path


def probe_job(data: Path, output: Path, attempts: int) -> Any:
    from tailguard.agent.graph.api import Job

    job = Job("bench-dispatch")
    # A fixed parallelism: one subtask per split, whatever the decider's volume per task.
    probe = job.read_parquet(str(data), name="probe", parallelism=attempts)
    probe.map(identity, name="identity").write_parquet(str(output), name="sink")
    return job


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", help="an existing cluster (default: start a local one)")
    parser.add_argument("--workers", type=int, default=3, help="workers of the local cluster")
    parser.add_argument("--attempts", type=int, default=120, help="attempts per job")
    parser.add_argument("--jobs", type=int, default=3, help="jobs (the first is a warm-up)")
    args = parser.parse_args()
    if args.jobs < 2 or args.attempts < 1:
        raise SystemExit("need --jobs >= 2 (the first is a warm-up) and --attempts >= 1")

    from tailguard.agent.adapters.spark import session_builder
    from tailguard.agent.entry import run
    from tailguard.cluster.local import LocalCluster
    from tailguard.settings_file import load_settings

    work = Path(tempfile.mkdtemp(prefix="tailguard-bench-agent-"))
    cluster = None
    spark = None
    lines: list[str] = []
    try:
        master = args.master
        if master is None:
            cluster = LocalCluster(args.workers, 1, "1g", work / "cluster")
            master = cluster.start()
        settings = load_settings(
            None,
            environ={},
            extra={
                "tailguard.work-dir": str(work),
                "tailguard.archive-dir": str(work / "archive"),
            },
        )
        data = generate(work / "data", args.attempts)
        spark = session_builder(master, "tailguard-bench-agent").getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        dispatch: list[float] = []
        to_running: list[float] = []
        jobs_s: list[float] = []
        attempts = 0
        for i in range(args.jobs):
            output = work / "out" / f"job-{i}"
            job = probe_job(data, output, args.attempts)
            result = run(
                job, spark, log_mode="archive", services=False, settings=settings, progress=False
            )
            if not result.ok:
                raise RuntimeError(f"probe job {i} ended {result.status}: {result.message}")
            if i == 0:
                continue  # warm-up: the runners' Python workers start and import
            dispatch.extend(result.dispatch_ms)
            attempts += len(result.attempts)
            to_running.extend(result.deploy_to_running_ms)
            jobs_s.append(result.duration_s)
        load = os.getloadavg()
        lines.append(report.dispatch_line(dispatch))
        lines.append(
            f"  {len(dispatch)} samples from {attempts} attempts in {args.jobs - 1} jobs over "
            f"{args.attempts} splits (after one warm-up job), {master}, load average "
            f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f}, {os.cpu_count()} cores"
        )
        if to_running:
            lines.append(
                f"  deploy -> running  p50 {percentile(to_running, 50):.1f} ms  "
                f"p99 {percentile(to_running, 99):.1f} ms  "
                f"max {max(to_running):.1f} ms"
            )
        if dispatch:
            lines.append(f"  dispatch max {max(dispatch):.1f} ms")
        lines.append(
            "  job time "
            + ", ".join(f"{s:.2f} s" for s in jobs_s)
            + f" ({args.attempts} attempts each)"
        )
        lines += [f"  {g}" for g in report.dispatch_goals(dispatch)]
        lines.append("  reproduce: " + shlex.join([sys.executable, *sys.argv]))
    finally:
        if spark is not None:
            spark.stop()
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    print("\n".join(lines))
    return 0 if dispatch else 1


if __name__ == "__main__":
    start = time.monotonic()
    code = main()
    print(f"  wall time {time.monotonic() - start:.0f} s")
    sys.exit(code)
