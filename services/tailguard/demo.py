"""`tailguard demo` (and `make demo`): the whole system on one machine.

1. the embedded broker, a 3-worker local Spark cluster and the five services;
2. one worker made 5x slow in io mode: a genuinely slow node (below);
3. the sales example at a size that takes about a minute, with progress; its work per row is
   I/O-bound (`sales_by_region.fetch`), so the slow node's tasks take 5x as long;
4. the summary: job time, attempts, speculation, blocked hosts, parallelism and who decided it,
   failures and restarts, where the output and the archive are; the output checked against a
   pandas reference;
5. `tailguard replay` over the archive, with no settings file: the services recorded theirs in
   the log;
6. everything it started, stopped again (what was already running is left running).

`--no-services` runs the same job with the services down, for comparison; `--pyspark` runs the
same work as plain PySpark (no tailguard) and prints what the slow node costs its tasks.

Why io mode and I/O-bound work: three executors on this 2-core machine outnumber the cores, so
pausing one worker's processes (cpu mode) hands its CPU to the other two, and a "5x" node cost
plain PySpark ~1.26x (design §7), with a `ThrottleWarning` saying so. Fewer workers than cores
would make cpu mode honest, but two workers leave one healthy host: no copy has a second place
to go, and `blocklist.max-blocked-fraction` (0.5) blocks none of two hosts. A wait that takes
`factor` times longer on the slow host (`slowness.io_work`) removes the capacity it claims to on
any number of cores, and under load as well: the other processes' CPU does not shorten it.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

from tailguard.settings_file import SHELL_DEFAULTS, load_settings

DEMO_DIR = Path("work") / "demo"
SLOW_FACTOR = 5.0
SLOW_MODE = "io"  # see the module's docstring
WORKERS = 3

# Policy settings scaled to a one-minute job (Flink's defaults suit hour-long jobs: a one-minute
# lower bound would never flag anything here).
DEMO_POLICY: dict[str, str] = {
    "slow-task-detector.check-interval": "500 ms",
    "slow-task-detector.execution-time.baseline-lower-bound": "1500 ms",
    "execution.batch.speculative.block-slow-node-duration": "20 s",
    # The demo's head chain has a handful of subtasks on 3 hosts: slow attempts are flagged only
    # once 75% of them finished, so a host is rarely caught on two distinct subtasks within the
    # evidence window. One is enough here, as in Flink; the default (2) is for real clusters.
    "blocklist.min-slow-attempts": "1",
    # Few waves: a straggler is flagged once 75% of its vertex finished, so with many short
    # waves a copy would start too late to win (with sales→score→partial chained, 256 KiB gave
    # 7 subtasks of the e2e data and the 6th finished only as the straggler did).
    "execution.batch.adaptive.auto-parallelism.avg-data-volume-per-task": "512 KiB",
    "execution.batch.adaptive.auto-parallelism.max-parallelism": "12",
    "decider.timeout": "5 s",
    "failover.timeout": "5 s",
}
# The data: enough splits for several waves on 3 slots (two row groups, splits, per file).
DEMO_DATA = {"files": 24, "rows": 12_000}
# The I/O-bound work per row on a healthy host: 2.4 s per split of 6,000 rows, 115 s of work
# in all, which 3 healthy hosts would do in under 40 s and the slow one does 5x slower.
IO_S_PER_ROW = 0.0004


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-services", action="store_true", help="run with the services down (local fallbacks)"
    )
    parser.add_argument("--work-dir", default=str(DEMO_DIR), help=f"default {DEMO_DIR}")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the data size")
    parser.add_argument(
        "--slow-factor", type=float, default=SLOW_FACTOR, help="how much slower the slow node is"
    )
    parser.add_argument(
        "--pyspark",
        action="store_true",
        help="run the same work as plain PySpark, and say what the slow node costs its tasks",
    )
    parser.add_argument("--no-progress", action="store_true")


def _say(message: str) -> None:
    print(f"[demo] {message}", flush=True)


def write_settings(work_dir: Path) -> Path:
    """The demo's settings file, which the services read too (replay must use the same)."""
    values = {
        **DEMO_POLICY,
        "tailguard.work-dir": str(work_dir),
        "tailguard.archive-dir": str(work_dir / "archive"),
    }
    lines = [f'"{k}" = "{v}"' for k, v in sorted(values.items())]
    path = work_dir / "tailguard.toml"
    path.write_text("# written by `tailguard demo`\n" + "\n".join(lines) + "\n")
    return path


def _service_metrics(work_dir: Path) -> list[str]:
    """FLIP-168's metrics as the speculator service reports them (Prometheus endpoint)."""
    from tailguard.shell import supervisor

    speculator = supervisor.running(work_dir).get("speculator")
    if speculator is None:
        return []
    try:
        values = speculator.metrics()
    except OSError as err:
        return [f"speculator metrics unavailable: {err}"]
    effective = values.get("tailguard_effective_speculative_executions_total", 0)
    slow = values.get("tailguard_slow_execution_vertices", 0)
    return [
        "speculator metrics: "
        f"tailguard_effective_speculative_executions_total={effective:g}"
        f", tailguard_slow_execution_vertices={slow:g}"
    ]


def run(args: argparse.Namespace) -> int:
    from tailguard import stack
    from tailguard.agent.adapters.spark import session_builder
    from tailguard.agent.entry import run as run_job
    from tailguard.bench import plain_spark
    from tailguard.examples import sales_by_region as example
    from tailguard.model.config import Settings
    from tailguard.replay.engine import replay
    from tailguard.replay.inputs import read_archive

    work_dir = Path(args.work_dir).resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    config = write_settings(work_dir)
    settings = load_settings(config, environ={})
    assert all(k in settings for k in SHELL_DEFAULTS)
    data = work_dir / "data" / "sales"
    files = max(3, int(DEMO_DATA["files"] * args.scale))
    if not data.exists():
        _say(f"generating {files} Parquet files of sales under {data}")
        example.generate(data, files=files, rows_per_file=DEMO_DATA["rows"])
    output = work_dir / "out" / "sales_by_region"
    started = time.monotonic()
    if args.pyspark:
        return _run_plain(work_dir, data, args.slow_factor, started)
    if args.no_services:
        _say("services: not started (--no-services): every decision is a local fallback")
    request = stack.StackRequest(
        work_dir,
        services=() if args.no_services else None,
        config=config,
        cluster=stack.ClusterSpec(WORKERS),
    )
    try:
        brought_up = stack.up(request, _say)
    except stack.StackError as err:  # which part, and where its log is
        print(f"tailguard demo: {err}", file=sys.stderr)
        return 1
    with brought_up as up:
        assert up.cluster is not None
        cluster = up.cluster.local
        spark = session_builder(cluster.master_url, app_name="tailguard demo").getOrCreate()
        # Cancelled attempts (lost races) are expected here; Spark would warn about each.
        spark.sparkContext.setLogLevel("ERROR")
        try:
            stack.await_executors(spark, cluster.hosts())
            # Before the clock, as `--pyspark` and the bench do: each executor's Python worker
            # starts here. A fresh session's first Spark task pays the executor's and its
            # Python's start-up (10-12 s of the job in a cold demo), which is not the job's.
            plain_spark.warm_up(spark.sparkContext, cluster.hosts())
            slow = cluster.hosts()[-1]
            cluster.throttle(slow, args.slow_factor, mode=SLOW_MODE)
            _say(f"{slow} {args.slow_factor:g}x slow for I/O-bound work: the slow node")
            job = example.make_job(data, output, io_s_per_row=IO_S_PER_ROW)
            result = run_job(
                job,
                spark,
                services=not args.no_services,
                settings=settings,
                progress=not args.no_progress,
            )
            service_metrics = _service_metrics(work_dir) if not args.no_services else {}
        finally:
            spark.stop()
            with contextlib.suppress(Exception):
                cluster.unthrottle(cluster.hosts()[-1])
    print()
    print(result.summary())
    for line in service_metrics:
        print(line)
    ok = result.ok
    ok = ok and _output_checked(data, output)
    if result.archive:
        # As an auditor holding only the archive would: the settings the services recorded.
        report = replay(read_archive(Path(result.archive), settings), Settings())
        recorded = sum(1 for plan in report.settings if plan.recorded)
        print(
            f"replay of {result.archive} (`tailguard replay ARCHIVE`, no settings file; "
            f"{recorded} of {len(report.settings)} services' settings recorded in it):"
        )
        for service in report.services:
            print(f"  {service.line()}")
        ok = ok and report.differences == 0
        from tailguard.inspect.timeline_cli import write_timeline

        print(f"timeline: {write_timeline(str(result.archive), settings)} (open in a browser)")
    print(
        f"demo finished in {time.monotonic() - started:.0f} s "
        f"(job {result.duration_s:.1f} s, services {'off' if args.no_services else 'on'})"
    )
    return 0 if ok else 1


def _output_checked(data: Path, output: Path) -> bool:
    from tailguard.examples import sales_by_region as example

    expected = example.reference(data)
    actual = example.read_output(output)
    same = bool(expected.equals(actual[expected.columns.tolist()]))
    print(
        f"output: {len(actual)} rows, {'equal to' if same else 'DIFFERENT from'} "
        "the pandas reference"
    )
    return same


def slow_node_cost(by_host: dict[str, list[float]], slow: str) -> float | None:
    """How many times longer the slow host's tasks took than the others' (means), or None
    when either side ran none."""
    others = [d for host, times in by_host.items() if host != slow for d in times]
    mine = by_host.get(slow, [])
    if not mine or not others or sum(others) <= 0:
        return None
    return (sum(mine) / len(mine)) / (sum(others) / len(others))


def _run_plain(work_dir: Path, data: Path, factor: float, started: float) -> int:
    """The same splits and work as plain PySpark (the bench's I/O job: a task per split) on
    the same cluster and slow node, with what the slow node costs its tasks, from Spark's own
    record of them."""
    from tailguard import stack
    from tailguard.bench import plain_spark

    output = work_dir / "out" / "sales_by_region-pyspark"
    rows_per_split = DEMO_DATA["rows"] // 2
    with stack.cluster(work_dir, WORKERS, _say) as cluster:
        builder = plain_spark.session_builder(cluster.master_url, "tailguard demo (plain)", ())
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        try:
            stack.await_executors(spark, cluster.hosts())
            plain_spark.warm_up(spark.sparkContext, cluster.hosts())
            slow = cluster.hosts()[-1]
            cluster.throttle(slow, factor, mode=SLOW_MODE)
            _say(f"{slow} {factor:g}x slow for I/O-bound work: the slow node")
            skip = plain_spark.stage_ids(spark.sparkContext)
            run = plain_spark.run_job(
                spark,
                "io",
                data,
                output,
                0,
                task_s=IO_S_PER_ROW * rows_per_split,
                rows_per_split=rows_per_split,
            )
            by_host = plain_spark.task_seconds_by_host(spark.sparkContext, skip, run.tasks)
        finally:
            spark.stop()
            with contextlib.suppress(Exception):
                cluster.unthrottle(cluster.hosts()[-1])
    print()
    print(f"plain PySpark: job {run.duration_s:.1f} s, {run.tasks} tasks (one per split)")
    for host, times in sorted(by_host.items()):
        mark = " (the slow node)" if host == slow else ""
        print(
            f"  {host}{mark}: {len(times)} tasks, mean {sum(times) / len(times):.2f} s, "
            f"longest {max(times):.2f} s"
        )
    cost = slow_node_cost(by_host, slow)
    if cost is not None:
        print(f"the slow node's tasks took {cost:.2f}x the others' (mean task time)")
    ok = _output_checked(data, output)
    print(f"demo finished in {time.monotonic() - started:.0f} s (plain PySpark)")
    return 0 if ok else 1


if __name__ == "__main__":
    from tailguard.cli import main

    sys.exit(main(["demo", *sys.argv[1:]]))
