"""What observe mode costs the job it watches (`make bench-observe`; target: <= 2% job time).

    .venv/bin/python benchmarks/observe_overhead.py [--pairs 6] [--runs 3] [--files 48]
        [--rows 50000] [--master local[2]] [--work-dir work/bench-observe]

An unmodified PySpark application (a groupBy aggregation over Parquet: `--files` files of
`--rows` rows, one scan task per file, 200 reduce tasks: about 250 tasks a job, since the
listener's work is per task) is submitted with `spark-submit`, plain and in the documented
no-code form (`--jars` + `spark.extraListeners`), the two interleaved (plain/observed, then
observed/plain, ...) so that drift in the machine's load falls on both alike. Inside each
application a warm-up job runs first (JIT, Python workers, file listing; the relay, which starts
with the application, is up by then), then the job `--runs` times; the application's figure is
the median of its runs' wall times, from the DataFrame call to the collected result.

The relay writes the archive only (`tailguard.observe.log-mode=archive`): no broker needed, and
what the job pays is the same, since publishing runs in the relay's process, not the job's.

Printed: per contender the median and the spread (min-max) of the applications' figures, the
overhead of the medians, the load average before and after (`uptime`: other processes share the
cores), and the tasks per job the relay saw.

The wall times of one application spread by +-15% on a 2-core machine, more than the 2% to be
resolved, so the bench also accounts for CPU, which noise moves far less: each application's
CPU time (user + system of spark-submit and everything it waited for: the JVM, the Python driver
and workers, the relay), the relay's own CPU (its log line) and the listener's time on Spark's
listener-bus thread (its line). Observe mode's share of the observed application's CPU bounds
what it can take from a job whose cores are all busy; on a machine with a spare core, the
relay's work is not on the job's path at all.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq

from tailguard.processes.trees import descendants

# The timed job, the same in both applications: `spark` and `path` are the script's.
JOB = """
def job():
    started = time.perf_counter()
    totals = spark.read.parquet(path).groupBy("customer").agg(
        F.sum("amount").alias("total"), F.count("*").alias("n")
    )
    totals.agg(F.sum("total"), F.sum("n")).collect()
    return time.perf_counter() - started
"""

APPLICATION = (
    """
import json, statistics, sys, time
from pyspark.sql import SparkSession, functions as F

path, out, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
spark = SparkSession.builder.appName("bench-observe").getOrCreate()
"""
    + JOB
    + """

job()  # warm-up
times = [job() for _ in range(runs)]
spark.stop()
json.dump({"median": statistics.median(times), "times": times}, open(out, "w"))
"""
)

# `--within`: one application, observed (`Observation.resume`) for every other job, paused
# (`Observation.pause`) for the others. After `--warmups` observed jobs, pairs of jobs in ABBA
# order (plain, observed, observed, plain, ...), so the state changes every other job; a pause
# drains Spark's listener bus first, so a job's events all reach the listener or none do. The
# relay lives for the whole application and idles (blocked on its pipe) while paused, so what
# differs between the two kinds of job is exactly observe's per-task work: the listener's and
# the relay's. The relay's start-up is not in it (it happens once, at `observe()`, before the
# warm-up jobs).
WITHIN_APPLICATION = (
    """
import json, sys, time
from pyspark.sql import SparkSession, functions as F
import tailguard

path, out, archive = sys.argv[1:4]
pairs, warmups = int(sys.argv[4]), int(sys.argv[5])
spark = SparkSession.builder.appName("bench-observe-within").getOrCreate()
"""
    + JOB
    + """

observation = tailguard.observe(
    spark, {"tailguard.observe.log-mode": "archive", "tailguard.archive-dir": archive}
)
# Warm-up, observed: the relay is up and warm, and the JVM's JIT has compiled the job's paths
# (a fresh application's jobs get faster for ~10 runs: 10 s -> 3 s here).
for _ in range(warmups):
    job()
times = {"plain": [], "observed": []}
for pair in range(pairs):
    for observed in ((False, True) if pair % 2 == 0 else (True, False)):
        if observed:
            observation.resume()
        else:
            observation.pause()
        times["observed" if observed else "plain"].append(job())
status = observation.close()
spark.stop()
json.dump({"times": times, "relay_status": status}, open(out, "w"))
"""
)

# One scan task per file and every reduce partition its own task: many tasks per second, the
# listener's worst case (its cost is per task event).
MANY_TASKS = {
    "spark.sql.files.openCostInBytes": str(256 << 20),
    "spark.sql.adaptive.coalescePartitions.enabled": "false",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
}


def write_data(directory: Path, files: int, rows: int) -> Path:
    marker = directory / f".{files}x{rows}"
    if marker.exists():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.parquet"):
        old.unlink()
    rng = np.random.default_rng(1)
    for n in range(files):
        table = pa.table(
            {"customer": rng.integers(0, 100_000, rows), "amount": rng.random(rows) * 100}
        )
        pq.write_table(table, directory / f"part-{n:03d}.parquet")
    marker.touch()
    return directory


@dataclasses.dataclass(frozen=True)
class Application:
    """One submitted application's figures."""

    median_s: float  # of its timed jobs' wall times
    cpu_s: float  # user + system of the whole application, relay included
    relay_cpu_s: float = 0.0  # the relay's own (observed applications)
    bus_ms: float = 0.0  # the listener's time on Spark's listener-bus thread
    bus_events: int = 0


def run_measured(argv: list[str], env: dict[str, str]) -> tuple[int, str, float]:
    """Runs `argv` to its end: its exit status, its standard error, and the CPU (user + system,
    s) of its whole process tree. The tree is sampled every 0.2 s and each process counted at
    its last sample: the JVM does not wait for every process it starts (Python workers), so
    the kernel's children accounting would miss some. What a process spent after its last
    sample (< 0.2 s of it) is missed, alike for both contenders."""
    last: dict[int, float] = {}
    with tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=env)
        while True:
            for pid in descendants(process.pid):
                with contextlib.suppress(psutil.Error):  # ended meanwhile
                    times = psutil.Process(pid).cpu_times()
                    last[pid] = times.user + times.system
            try:
                process.wait(timeout=0.2)  # the next sample, unless it ends first
                break
            except subprocess.TimeoutExpired:
                continue
        err.seek(0)
        stderr = err.read()
    return process.returncode, stderr, sum(last.values())


def observe_costs(stderr: str) -> tuple[float, float, int]:
    """The relay's CPU (s), and the listener's bus time (ms) and events, from their log lines;
    stops the bench if the relay did not end cleanly."""
    relay = re.search(r"relay CPU ([0-9.]+) s", stderr)
    bus = re.search(r"listener took ([0-9.]+) ms of the listener bus for ([0-9]+) events", stderr)
    if " 0 malformed" not in stderr or relay is None or bus is None:
        raise SystemExit(f"the relay did not end cleanly:\n{stderr[-3000:]}")
    return float(relay.group(1)), float(bus.group(1)), int(bus.group(2))


def spark_submit(
    args: argparse.Namespace,
    work: Path,
    data: Path,
    name: str,
    script: str,
    script_args: list[str],
    conf: dict[str, str],
    jar: bool,
) -> tuple[Any, str, float]:
    """Submits `script` (an application taking the data path, its result file, then
    `script_args`), with the listener's jar on its class path if `jar`: its result (JSON), its
    standard error and the CPU of its whole process tree."""
    from tailguard.observer import listener_jar

    app = work / f"{name}.py"
    app.write_text(script)
    out = work / f"result-{name}.json"
    argv = [str(Path(sys.executable).parent / "spark-submit"), "--master", args.master]
    if jar:
        argv += ["--jars", str(listener_jar())]
    for key, value in {**MANY_TASKS, **conf}.items():
        argv += ["--conf", f"{key}={value}"]
    argv += [str(app), str(data), str(out), *script_args]
    code, stderr, cpu_s = run_measured(argv, {**os.environ, "PYSPARK_PYTHON": sys.executable})
    if code != 0:
        raise SystemExit(f"spark-submit failed ({code}):\n{stderr[-3000:]}")
    return json.loads(out.read_text()), stderr, cpu_s


def submit(args: argparse.Namespace, work: Path, data: Path, observed: bool, n: int) -> Application:
    # The documented no-code form: the listener named in the application's configuration.
    conf = {
        "spark.extraListeners": "tailguard.observe.TaskEventListener",
        "spark.tailguard.observe.python": sys.executable,
        "spark.tailguard.tailguard.observe.log-mode": "archive",
        "spark.tailguard.tailguard.archive-dir": str(work / "archive"),
    }
    name = f"application-{n}-{'observed' if observed else 'plain'}"
    result, stderr, cpu_s = spark_submit(
        args, work, data, name, APPLICATION, [str(args.runs)], conf if observed else {}, observed
    )
    if not observed:
        return Application(float(result["median"]), cpu_s)
    return Application(float(result["median"]), cpu_s, *observe_costs(stderr))


@dataclasses.dataclass(frozen=True)
class Within:
    """One `--within` application's figures: its jobs' wall times, in pairs."""

    plain_s: list[float]
    observed_s: list[float]
    cpu_s: float
    relay_cpu_s: float
    bus_ms: float
    bus_events: int

    def quad_overheads(self) -> list[float]:
        """Per ABBA quad (two pairs: plain, observed, observed, plain), observed / plain - 1,
        in %: a trend in job times that is linear over four jobs cancels out."""
        pairs = list(zip(self.plain_s, self.observed_s, strict=True))
        return [
            100 * ((o1 + o2) / (p1 + p2) - 1)
            for (p1, o1), (p2, o2) in zip(pairs[0::2], pairs[1::2], strict=False)
        ]


def submit_within(args: argparse.Namespace, work: Path, data: Path, n: int) -> Within:
    script_args = [str(work / "archive"), str(args.pairs), str(args.warmups)]
    result, stderr, cpu_s = spark_submit(
        args, work, data, f"within-{n}", WITHIN_APPLICATION, script_args, {}, True
    )
    if result["relay_status"] != 0:
        raise SystemExit(f"the relay did not end cleanly:\n{stderr[-3000:]}")
    times = result["times"]
    return Within(times["plain"], times["observed"], cpu_s, *observe_costs(stderr))


def main_within(args: argparse.Namespace, work: Path, data: Path) -> int:
    print(
        f"load before: {load()}; {args.apps} application(s), {args.pairs} pairs of jobs each",
        flush=True,
    )
    apps: list[Within] = []
    for n in range(args.apps):
        app = submit_within(args, work, data, n)
        apps.append(app)
        quads = app.quad_overheads()
        print(
            f"application {n + 1}: plain {spread(app.plain_s)}, observed {spread(app.observed_s)};"
            f" quads {statistics.median(quads):+.1f}% median ({min(quads):+.1f}%"
            f"..{max(quads):+.1f}%); CPU {app.cpu_s:.1f} s, relay {app.relay_cpu_s:.2f} s,"
            f" listener bus {app.bus_ms:.1f} ms for {app.bus_events} events; load {load()}",
            flush=True,
        )
    quads = sorted(x for app in apps for x in app.quad_overheads())
    mean = statistics.fmean(quads)
    # 95% interval of the mean, normal approximation (n >= 16 quads by default).
    half = 1.96 * statistics.stdev(quads) / len(quads) ** 0.5
    plain = [x for app in apps for x in app.plain_s]
    observed = [x for app in apps for x in app.observed_s]
    print(f"tasks: {tasks_per_job(work / 'archive')}")
    print(f"plain jobs:    {spread(plain)}")
    print(f"observed jobs: {spread(observed)}")
    print(
        f"per ABBA quad, observed / plain - 1 ({len(quads)} quads): mean {mean:+.2f}%"
        f" (95% interval {mean - half:+.2f}%..{mean + half:+.2f}%), median"
        f" {statistics.median(quads):+.2f}%, range {quads[0]:+.1f}%..{quads[-1]:+.1f}%;"
        f" observed slower in {sum(x > 0 for x in quads)} (target <= 2%)"
    )
    relay = [100 * a.relay_cpu_s / a.cpu_s for a in apps]
    print(
        f"relay CPU (start-up included) {statistics.median(relay):.2f}% of the application's,"
        f" for the observed half of its jobs"
    )
    print(f"load after: {load()}")
    return 0


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def spread(values: list[float]) -> str:
    median = statistics.median(values)
    return f"median {median:.3f} s (min {min(values):.3f}, max {max(values):.3f})"


def tasks_per_job(archive_dir: Path) -> str:
    from tailguard.archive import ArchiveReader
    from tailguard.model import records as r

    archives = sorted(archive_dir.glob("*.avro"), key=lambda p: p.stat().st_mtime)
    if not archives:
        return "?"
    records = [e.record for e in ArchiveReader(archives[-1])]
    jobs = {x.job_id for x in records if isinstance(x, r.JobSubmitted)}
    attempts = sum(isinstance(x, r.AttemptDeploying) for x in records)
    return f"{attempts / max(1, len(jobs)):.0f} attempts per Spark job, {len(jobs)} Spark jobs"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--files", type=int, default=48)
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--work-dir", default="work/bench-observe")
    parser.add_argument(
        "--within",
        action="store_true",
        help="time plain and observed jobs inside the same applications (--apps of them, "
        "--pairs pairs of jobs each): the listener is detached for every other job",
    )
    parser.add_argument("--apps", type=int, default=2, help="applications, with --within")
    parser.add_argument("--warmups", type=int, default=10, help="untimed jobs first, with --within")
    args = parser.parse_args()
    if min(args.pairs, args.runs, args.files, args.rows, args.apps) < 1:
        parser.error("--pairs, --runs, --files, --rows and --apps must be positive")
    if args.within and (args.pairs % 2 or args.pairs * args.apps < 4 or args.warmups < 0):
        parser.error("--within needs an even --pairs, at least two quads in all, --warmups >= 0")

    from tailguard.observer import listener_jar

    work = Path(args.work_dir).resolve()
    data = write_data(work / "data", args.files, args.rows)
    listener_jar()  # built once, before anything is timed
    if args.within:
        return main_within(args, work, data)
    print(f"load before: {load()}", flush=True)
    apps: dict[str, list[Application]] = {"plain": [], "observed": []}
    for pair in range(args.pairs):
        order = (False, True) if pair % 2 == 0 else (True, False)
        for observed in order:
            apps["observed" if observed else "plain"].append(
                submit(args, work, data, observed, pair)
            )
        p, o = apps["plain"][-1], apps["observed"][-1]
        print(
            f"pair {pair + 1}: plain {p.median_s:.3f} s (CPU {p.cpu_s:.1f} s), observed "
            f"{o.median_s:.3f} s (CPU {o.cpu_s:.1f} s, relay {o.relay_cpu_s:.2f} s, listener "
            f"bus {o.bus_ms:.1f} ms for {o.bus_events} events), load {load()}",
            flush=True,
        )
    times = {c: [a.median_s for a in apps[c]] for c in apps}
    plain, observed = (statistics.median(times[c]) for c in ("plain", "observed"))
    print(f"tasks: {tasks_per_job(work / 'archive')}")
    print(f"plain:    {spread(times['plain'])}")
    print(f"observed: {spread(times['observed'])}")
    print(f"overhead of the medians: {100 * (observed / plain - 1):+.1f}% (target <= 2%)")
    watched = apps["observed"]
    relay_share = [100 * a.relay_cpu_s / a.cpu_s for a in watched]
    bus_share = [100 * a.bus_ms / 1000 / a.cpu_s for a in watched]
    cpu = {c: statistics.median(a.cpu_s for a in apps[c]) for c in apps}
    print(
        f"CPU: plain median {cpu['plain']:.1f} s, observed {cpu['observed']:.1f} s "
        f"({100 * (cpu['observed'] / cpu['plain'] - 1):+.1f}%); observe's own share of the "
        f"observed application's CPU: relay median {statistics.median(relay_share):.2f}% "
        f"(max {max(relay_share):.2f}%), listener bus median "
        f"{statistics.median(bus_share):.3f}% (max {max(bus_share):.3f}%)"
    )
    print(f"load after: {load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
