"""`tailguard bench` (and `make bench`): tailguard against Spark's own mechanisms, side by side.

Writes `<out>/<YYYY-MM-DD-HHMM>.json` (every run's raw figures) and `<out>/<YYYY-MM-DD-HHMM>.md`
(the tables), and prints the tables and the command that reproduces them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path

from tailguard.bench import scenarios as sc
from tailguard.bench import summary
from tailguard.broker.embedded import broker_name

BENCH_DIR = Path("work") / "bench"
RESULTS_DIR = Path("benchmarks") / "results"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=3, help="runs per contender (default 3)")
    parser.add_argument(
        "--scenarios",
        default=None,
        help=f"comma-separated, from {', '.join(sc.SCENARIOS)} "
        f"(default {','.join(sc.DEFAULT_SCENARIOS)})",
    )
    parser.add_argument(
        "--contenders",
        default=None,
        help="comma-separated subset of: " + ", ".join(c.name for c in sc.CONTENDERS),
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"1 run, {sc.IO_QUICK.tasks} I/O tasks, scenarios {','.join(sc.QUICK_SCENARIOS)} "
        f"and contenders {', '.join(sc.QUICK_CONTENDERS)} unless given (a few minutes)",
    )
    parser.add_argument(
        "--task-seconds",
        type=float,
        default=None,
        help=f"I/O mode: a task's wait on a healthy host (default {sc.IO_FULL.task_s:g}); longer "
        "tasks make the wait, not the 2 cores' CPU, the job's limit",
    )
    parser.add_argument(
        "--mock",
        action="store_true",
        help="run the stack on librdkafka's mock broker, not Apache Kafka (to compare with "
        "figures taken before Apache Kafka was the default)",
    )
    parser.add_argument("--out", default=str(RESULTS_DIR), help=f"default {RESULTS_DIR}")
    parser.add_argument("--work-dir", default=str(BENCH_DIR), help=f"default {BENCH_DIR}")


def _say(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


def _usage_error(message: str) -> int:
    print(f"tailguard bench: {message}", file=sys.stderr)
    return 2


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.1f} (1 min), {five:.1f} (5 min)"


def run(args: argparse.Namespace) -> int:
    try:
        default = sc.QUICK_SCENARIOS if args.quick else sc.DEFAULT_SCENARIOS
        chosen = sc.select(args.scenarios, default)
        contenders = sc.select_contenders(
            args.contenders, sc.QUICK_CONTENDERS if args.quick else None
        )
    except ValueError as err:  # a name that is not a scenario or contender
        return _usage_error(str(err))
    runs = 1 if args.quick else args.runs
    if runs < 1:
        return _usage_error(f"--runs must be at least 1, not {runs}")
    task_s = args.task_seconds
    if task_s is not None and not 0 < task_s <= 600:
        return _usage_error(f"--task-seconds must be above 0 and at most 600, not {task_s:g}")
    # Spark is imported only once the request is known to be good.
    from tailguard.bench.runner import Bench
    from tailguard.bench.runner import workers_for as runner_workers

    names = {s.name for s in chosen}
    for s in chosen:
        if s.healthy and s.healthy not in names:
            _say(f"note: {s.name}'s ideal comes from {s.healthy}'s runs; add {s.healthy} to get it")
    size = sc.QUICK if args.quick else sc.FULL
    io = sc.IO_QUICK if args.quick else sc.IO_FULL
    if task_s is not None:
        io = dataclasses.replace(io, task_s=task_s)
    argv = sys.argv[1:]
    given = argv[argv.index("bench") + 1 :] if "bench" in argv else []
    command = f"tailguard bench {shlex.join(given)}"
    load_before = _load()
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    bench = Bench(
        Path(args.work_dir).resolve(), size, io, chosen, runs, _say, contenders, args.mock
    )
    result = bench.run()
    raw = [asdict(x) for x in result.records]
    header = {
        "date": started,
        "command": command.strip(),
        "machine": f"{os.cpu_count()} cores; load average before {load_before}, after {_load()}",
        "I/O mode": f"{io.workers} workers × 1 core, {io.tasks} tasks of {io.task_s:g} s "
        f"({io.rows_per_split} rows each), slow node {sc.SCENARIOS['io-slow'].slow_factor:g}x "
        "by its slowness factor",
        "CPU mode": f"{runner_workers('cpu', io)} workers × 1 core, {size.splits} splits of "
        f"{size.rows_per_file // 2} rows, score work {size.work}",
        "broker": broker_name(args.mock)
        + (f"; {result.broker_warm_up}" if result.broker_warm_up else ""),
        "runs": f"{runs} per contender, interleaved",
        "contenders": ", ".join(c.name for c in contenders),
        "total wall time": f"{result.wall_s / 60:.1f} min (including cluster and session start-up)",
        "Spark speculation defaults": ", ".join(
            f"{k}={v}" for k, v in result.spark_defaults.items()
        ),
    }
    if result.policy_changes:
        header["policy changed for the second job"] = ", ".join(
            f"{k}={v}" for k, v in result.policy_changes.items()
        ) + (
            f" (the bench's is {sc.block_duration()}: the fleet block must "
            "outlast a session's start-up)"
        )
        header["second job"] = (
            f"after each {sc.ATTACH_CONTENDER} run with the node slow throughout, a second "
            "attached application on the same cluster, the host still slow "
            f"(row '{sc.SECOND_JOB}'); every other run that reads the fleet list starts with "
            "it cleared"
        )
    text = summary.markdown(raw, [s.name for s in chosen], header, io)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # Date and time: a second run on the same day must not overwrite the first one's figures.
    stem = time.strftime("%Y-%m-%d-%H%M", time.gmtime()) + ("-quick" if args.quick else "")
    policy: dict[str, str] = {**sc.policy_for(size, io), **result.policy_changes}
    document = {
        **header,
        "size": asdict(size),
        "io_size": asdict(io),
        "policy": policy,
        "scenarios": [asdict(s) for s in chosen],
        "spark_defaults": result.spark_defaults,
        "runs_raw": raw,
        "latencies_ms": summary.latencies(raw),
    }
    (out / f"{stem}.json").write_text(json.dumps(document, indent=1, default=str) + "\n")
    (out / f"{stem}.md").write_text(text)
    print()
    print(text)
    print(f"written {out / (stem + '.json')} and {out / (stem + '.md')}")
    print(f"reproduce with: {command.strip()}")
    return 0 if all(x.ok for x in result.records) else 1


if __name__ == "__main__":
    from tailguard.cli import main

    sys.exit(main(["bench", *sys.argv[1:]]))
