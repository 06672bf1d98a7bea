"""Agent overhead on a Spark standalone cluster: the cost of one attempt, and exchange speed.

    .venv/bin/python benchmarks/agent_overhead.py [--master spark://HOST:PORT] [--jobs 120]
        [--rows 500000] [--subpartitions 128] [--in-process]

Without `--master` it starts its own 3-worker local cluster (1 core each) and stops it at the end.

(a) Per-attempt overhead: `--jobs` one-task attempts, one after the other, each pinned to a host
    (round robin) through the agent's real path, `SparkRuntime.submit` (pickled `TaskSpec`,
    pinned RDD, job group, `task.run_attempt` in the executor's Python worker, outcome back by
    callback). The task stamps its start time (`AttemptOutcome.started_at_ms`); driver and
    executors share this machine's clock, so "submit -> task started" is measured directly.
    Alternately with them runs a bare pinned Spark job that only stamps its start: Spark's own
    floor under the same load. The first `--warmup` attempts (Python workers starting) are
    left out.
(b) Exchange throughput: `partitions.write_partition` and `read_subpartitions` (checksum-verified)
    of a hash-partitioned table, measured inside a Spark task on each executor (one core each),
    or in this process with `--in-process`. MB are 10^6 bytes of in-memory Arrow data.

Prints figures and the targets; asserts nothing (timings depend on the machine and its load).
"""

from __future__ import annotations

import argparse
import os
import queue
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from tailguard.agent.executor.attempt import AttemptOutcome, OutputPlan, TaskSpec
from tailguard.agent.executor.exchange import hash_partition
from tailguard.agent.executor.partitions import read_subpartitions, write_partition
from tailguard.agent.executor.storage import Storage
from tailguard.model.records import Distribution, PartitionRef

OVERHEAD_TARGET_MS = 60.0
EXCHANGE_TARGET_MB_S = 150.0


def one_row() -> pa.Table:
    """The probe attempt's operator: no input, one row out (the cost is all overhead)."""
    return pa.table({"x": [1]})


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


# --------------------------------------------------------------------------- (a) overhead


def started_ms(_payload: object) -> float:
    """The bare Spark probe: just stamps when the task began."""
    return time.time() * 1000.0


def measure_overhead(
    runtime: Any, hosts: list[str], storage: Storage, jobs: int, warmup: int
) -> dict[str, list[float]]:
    """Submission -> task start of the agent's attempts, and of bare pinned Spark jobs run
    alternately with them (same load, same hosts), so the agent's own share shows."""
    from tailguard.cluster.pinning import pinned_rdd

    def bare(host: str) -> float:
        submitted_ms = time.time() * 1000.0
        stamp: float = pinned_rdd(runtime.sc, [(None, host)]).map(started_ms).collect()[0]
        return stamp - submitted_ms

    ended: queue.Queue[Any] = queue.Queue()
    timings: dict[str, list[float]] = {"start": [], "round_trip": [], "bare_start": []}
    for i in range(warmup + jobs):
        host = hosts[i % len(hosts)]
        spec = TaskSpec(
            job_id="bench-overhead",
            storage=storage,
            vertex="probe",
            subtask=0,
            attempt=i,
            fn=one_row,
            output=OutputPlan(Distribution.FORWARD, (), 1),
        )

        # Alternate which goes first, so neither always finds the host's worker just freed.
        bare_start = bare(host) if i % 2 else 0.0
        submitted_ms = time.time() * 1000.0
        runtime.submit(("probe", 0, i), host, spec, ended.put)
        outcome = ended.get(timeout=300)
        returned_ms = time.time() * 1000.0
        if not isinstance(outcome, AttemptOutcome) or not outcome.ok:
            raise RuntimeError(f"probe attempt {i} on {host} failed: {outcome!r}")
        if outcome.host != host and host != "localhost":
            raise RuntimeError(f"probe attempt {i} ran on {outcome.host}, not {host}")
        if not i % 2:
            bare_start = bare(host)
        if i >= warmup:
            timings["start"].append(outcome.started_at_ms - submitted_ms)
            timings["round_trip"].append(returned_ms - submitted_ms)
            timings["bare_start"].append(bare_start)
    return timings


# --------------------------------------------------------------------------- (b) exchange


def exchange_probe(params: dict[str, Any]) -> dict[str, Any]:
    """Write and read back one hash-partitioned result partition; runs where it is called
    (inside a Spark task, or in the driver)."""
    rows, parts, runs = params["rows"], params["subpartitions"], params["runs"]
    rng = np.random.default_rng(42)
    ints = rng.integers(0, 10**9, rows)
    table = pa.table(
        {
            "int_key": ints,
            "str_key": pa.array(np.char.add("customer-", (ints % 1_000_000).astype(str))),
            "value": rng.random(rows),
        }
    )
    split = hash_partition(table, ["int_key"], parts)
    write_s = read_s = float("inf")
    with tempfile.TemporaryDirectory(dir=params.get("dir")) as root:
        storage = Storage(root)
        for attempt in range(runs):
            ref = PartitionRef("p", 0, attempt)
            started = time.perf_counter()
            written = write_partition(storage, "bench-exchange", ref, split)
            write_s = min(write_s, time.perf_counter() - started)
            sums = {(0, sp): c for sp, c in enumerate(written.checksums)}
            started = time.perf_counter()
            read, _ = read_subpartitions(
                storage, "bench-exchange", "p", {0: attempt}, (0, 0), (0, parts - 1), sums
            )
            read_s = min(read_s, time.perf_counter() - started)
            if read.num_rows != rows:
                raise RuntimeError(f"read {read.num_rows} rows, wrote {rows}")
    return {
        "host": os.environ.get("SPARK_LOCAL_IP", "driver"),
        "bytes": table.nbytes,
        "disk_bytes": sum(written.bytes_per_subpartition),
        "write_s": write_s,
        "read_s": read_s,
    }


def print_exchange(result: dict[str, Any], where: str) -> tuple[float, float]:
    mb = result["bytes"] / 1e6
    write, read = mb / result["write_s"], mb / result["read_s"]
    print(
        f"  {where:<22} {mb:6.1f} MB ({result['disk_bytes'] / 1e6:.1f} MB on disk, zstd): "
        f"write {write:6.1f} MB/s, verified read {read:6.1f} MB/s"
    )
    return write, read


# --------------------------------------------------------------------------- main


def await_executors(runtime: Any, wanted: int, timeout_s: float = 120.0) -> dict[str, int]:
    deadline = time.monotonic() + timeout_s
    while len(executors := runtime.executors()) < wanted:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(executors)} of {wanted} executors registered")
        time.sleep(0.2)  # Spark has no registration callback to wait on
    return dict(executors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", help="an existing cluster (default: start a 3-worker one)")
    parser.add_argument("--workers", type=int, default=3, help="executors to wait for")
    parser.add_argument("--jobs", type=int, default=120, help="measured probe attempts (>= 100)")
    parser.add_argument("--warmup", type=int, default=6)
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--subpartitions", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3, help="exchange: best of this many")
    parser.add_argument("--in-process", action="store_true", help="exchange in this process")
    args = parser.parse_args()

    from pyspark.sql import SparkSession

    from tailguard.agent.adapters.spark import SparkRuntime, session_builder
    from tailguard.cluster.local import LocalCluster
    from tailguard.cluster.pinning import pinned_rdd

    print("reproduce:", shlex.join([sys.executable, *sys.argv]))
    work = Path(tempfile.mkdtemp(prefix="tailguard-bench-agent-"))
    cluster = None
    spark: SparkSession | None = None
    try:
        master = args.master
        if master is None:
            cluster = LocalCluster(args.workers, 1, "1g", work / "cluster")
            master = cluster.start()
        spark = session_builder(master, "tailguard-bench-agent").getOrCreate()
        runtime = SparkRuntime(spark)
        executors = await_executors(runtime, 1 if runtime.local else args.workers)
        hosts = sorted(executors)
        print(f"cluster {master}: executors {executors}; load average {os.getloadavg()}")

        timings = measure_overhead(
            runtime, hosts, Storage(str(work / "storage")), args.jobs, args.warmup
        )
        start, trip, bare = timings["start"], timings["round_trip"], timings["bare_start"]
        print(
            f"(a) per-attempt overhead over {len(start)} pinned one-task attempts "
            f"(SparkRuntime.submit, round robin over {len(hosts)} hosts, sequential):"
        )
        print(
            f"  submit -> task started  p50 {percentile(start, 50):6.1f} ms   "
            f"p99 {percentile(start, 99):6.1f} ms   (target p50 < {OVERHEAD_TARGET_MS:.0f} ms)"
        )
        print(
            f"  submit -> outcome back  p50 {percentile(trip, 50):6.1f} ms   "
            f"p99 {percentile(trip, 99):6.1f} ms"
        )
        print(
            f"  bare pinned Spark job   p50 {percentile(bare, 50):6.1f} ms   "
            f"p99 {percentile(bare, 99):6.1f} ms   (job -> task started, run alternately: "
            f"the agent adds {percentile(start, 50) - percentile(bare, 50):+.1f} ms at p50)"
        )

        params = {
            "rows": args.rows,
            "subpartitions": args.subpartitions,
            "runs": args.runs,
            "dir": str(work),
        }
        where = "in-process (driver)" if args.in_process else "in a Spark task, per executor"
        print(f"(b) exchange throughput per core, {args.subpartitions} subpartitions, {where}:")
        figures = []
        if args.in_process:
            figures.append(print_exchange(exchange_probe(params), "driver process"))
        else:
            for host in hosts:
                result = pinned_rdd(spark.sparkContext, [(params, host)]).map(exchange_probe)
                figures.append(print_exchange(result.collect()[0], f"task on {host}"))
        writes, reads = [w for w, _ in figures], [r for _, r in figures]
        print(
            f"  median: write {float(np.median(writes)):.1f} MB/s, read "
            f"{float(np.median(reads)):.1f} MB/s (target > {EXCHANGE_TARGET_MB_S:.0f} MB/s)"
        )
        runtime.close()
    finally:
        if spark is not None:
            spark.stop()
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
