"""Five jobs in a row on a cluster with one slow node (`make bench-fleet`, issue 13).

    .venv/bin/python benchmarks/fleet_five_jobs.py [--jobs 5] [--healthy 2] [--files 10]
        [--stages 2]

The I/O-mode job of `tailguard bench` (design §7: 6 workers on 2 cores, each task a wait of
2 s scaled by its host's slowness, so the slow node really loses 4/5 of its capacity; CPU
throttling would hand its CPU to the others), by default in two stages: the source's 20 tasks
wait, hand their rows round robin to 20 more that wait again, then the sums per region. With
one stage (`--stages 1`) the slow node gets exactly one task per job: too little evidence for
the default blocklist rule (two distinct slow subtasks), so the host is listed only after the
second job's slow attempt. One broker, the five services and one 6-worker
cluster for the whole bench. First `--healthy` rounds on the healthy cluster give the healthy
time; then `--jobs` rounds with the last worker 5x slow. Each round runs tailguard (services on:
the fleet blocklist) and plain PySpark with speculation (and no locality wait, see
NO_LOCALITY_WAIT), interleaved, each in its own
SparkSession, outputs checked against pandas. The fleet block lasts 30 min, longer than the
bench, so jobs 2-5 find it on the list when they start.

Reports, per job: time, ratio to the healthy median, attempts placed on the slow node, fleet
blocks applied before the job's first attempt and during it. Asserts nothing: timings depend on
the machine's load. `--set KEY=VALUE` changes a policy setting of tailguard's runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tailguard.bench.runner import Bench, RunRecord
from tailguard.bench.scenarios import QUICK, SCENARIOS, IoSize, select_contenders

TAILGUARD, SPECULATION = "tailguard+services", "pyspark+speculation"
PLAIN = "pyspark+speculation, locality.wait 0"
# Spark's reduce tasks prefer an executor holding >= 20% of their input and wait up to
# spark.locality.wait (3 s) for it: in the two-stage job that alone cost plain PySpark 4-5 s
# (25.3 s against 21.3 s, healthy, two runs each). The input is on a shared file system and
# the shuffle on loopback, so locality buys nothing here: the plain contender runs without
# the wait, so that what is compared is the scheduling around a slow node.
NO_LOCALITY_WAIT = (("spark.locality.wait", "0"),)
# Longer than the bench: jobs 2-5 start while the block job 1 earned still holds.
FLEET_POLICY = {"execution.batch.speculative.block-slow-node-duration": "30 min"}


def _archive_facts(rec: RunRecord, settings: Any) -> tuple[int, int, int]:
    """(attempts deployed on the slow host, fleet blocks applied before the job's first attempt,
    fleet blocks applied during the job) of a run, from its archive."""
    from tailguard.model import records as r
    from tailguard.model.fleet import FLEET_CAUSE_PREFIX
    from tailguard.replay.inputs import read_archive

    if not rec.archive:
        return -1, 0, 0
    records = [x.record for x in read_archive(Path(rec.archive), settings)]
    on_slow = sum(
        1 for e in records if isinstance(e, r.AttemptDeploying) and e.host == rec.slow_host
    )
    first_attempt = next(
        (i for i, e in enumerate(records) if isinstance(e, r.AttemptDeploying)), len(records)
    )
    fleet = [
        i
        for i, e in enumerate(records)
        if isinstance(e, r.NodeBlocked) and e.cause.startswith(FLEET_CAUSE_PREFIX)
    ]
    at_start = sum(1 for i in fleet if i < first_attempt)
    return on_slow, at_start, len(fleet) - at_start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5, help="jobs in a row with the slow node")
    parser.add_argument("--healthy", type=int, default=2, help="healthy rounds first")
    parser.add_argument(
        "--files", type=int, default=10, help="input files (2 tasks each, 2 s per task)"
    )
    parser.add_argument(
        "--stages", type=int, default=2, help="I/O stages per job, a round-robin exchange between"
    )
    parser.add_argument(
        "--work-dir", help="default: a new temporary directory, kept (the runs' archives)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a policy setting for tailguard's runs, e.g. blocklist.min-slow-attempts=1",
    )
    args = parser.parse_args()
    policy = dict(FLEET_POLICY)
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"--set needs KEY=VALUE, not {item!r}")
        policy[key.strip()] = value.strip()
    if args.jobs < 2 or args.healthy < 1 or args.files < 1 or args.stages < 1:
        raise SystemExit("need --jobs >= 2, --healthy >= 1, --files >= 1 and --stages >= 1")

    from tailguard import stack
    from tailguard.bench import runner
    from tailguard.settings_file import load_settings

    started = time.monotonic()
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="tailguard-bench-fleet-"))
    io = IoSize(files=args.files, rows_per_file=12_000, task_s=2.0, workers=6, stages=args.stages)
    tailguard, speculation = select_contenders(f"{TAILGUARD},{SPECULATION}")
    plain = dataclasses.replace(
        speculation, name=PLAIN, spark_conf=speculation.spark_conf + NO_LOCALITY_WAIT
    )
    bench = Bench(work, QUICK, io, [], 1, print, (tailguard, plain))
    work.mkdir(parents=True, exist_ok=True)
    config = runner.write_settings(work, QUICK, io, policy)
    settings = load_settings(config, environ={})
    healthy, slow = SCENARIOS["io-healthy"], SCENARIOS["io-slow"]
    data = {s.name: runner.prepare_data(work, io, s) for s in (healthy, slow)}
    rows: list[tuple[str, int, RunRecord]] = []
    defaults: dict[str, str] = {}
    with (
        runner._quiet_spark_logs(),
        stack.broker(work, print),
        stack.services(work, config, True, print),
        stack.cluster(work / "io", io.workers, print) as cluster,
    ):
        for phase, scenario, rounds in (
            ("healthy", healthy, args.healthy),
            ("slow", slow, args.jobs),
        ):
            for i in range(rounds):
                for contender in bench.contenders:
                    rec = bench._logged(cluster, settings, scenario, contender, i, data, defaults)
                    rows.append((phase, i + 1, rec))
    load = os.getloadavg()
    print(_table(rows, settings))
    if args.set:
        print(f"\n  tailguard's policy settings: {', '.join(args.set)}")
    print(
        f"\n  {io.stages} stage(s) of {io.tasks} tasks of {io.task_s:g} s on {io.workers} workers"
        " (one 5x slow in the"
        f" slow rounds), load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f},"
        f" {os.cpu_count()} cores, wall {time.monotonic() - started:.0f} s"
    )
    print("  reproduce: " + shlex.join([sys.executable, *sys.argv]))
    return 0 if all(rec.ok for _, _, rec in rows) else 1


def _table(rows: list[tuple[str, int, RunRecord]], settings: Any) -> str:
    def times(phase: str, contender: str) -> list[float]:
        return [
            rec.job_s
            for p, _, rec in rows
            if p == phase and rec.contender == contender and rec.ok
            if rec.job_s is not None
        ]

    header = "| job | contender | time (s) | / healthy median | attempts on slow node |"
    lines = [
        header + " fleet blocks at start | fleet blocks during | output |",
        "|---|---|---|---|---|---|---|---|",
    ]
    base = {c: statistics.median(times("healthy", c) or [float("nan")]) for c in (TAILGUARD, PLAIN)}
    for phase, n, rec in rows:
        label = f"healthy {n}" if phase == "healthy" else f"slow-node job {n}"
        facts = _archive_facts(rec, settings) if rec.contender == TAILGUARD else None
        on_slow, at_start, during = ("-", "-", "-") if facts is None else facts
        ratio = (rec.job_s or float("nan")) / base[rec.contender]
        lines.append(
            f"| {label} | {rec.contender} | {rec.job_s or float('nan'):.1f} | {ratio:.2f} |"
            f" {on_slow} | {at_start} | {during} | {'equal' if rec.output_equal else rec.error} |"
        )
    for c in (TAILGUARD, PLAIN):
        later = [s for p, n, rec in rows if p == "slow" and n > 1 and rec.contender == c
                 for s in [rec.job_s] if s is not None]  # fmt: skip
        if later:
            lines.append(
                f"\n  {c}: healthy median {base[c]:.1f} s; slow-node jobs 2+: median "
                f"{statistics.median(later):.1f} s ({statistics.median(later) / base[c]:.2f}x),"
                f" range {min(later):.1f}-{max(later):.1f} s"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
