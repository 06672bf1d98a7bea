"""`tailguard cluster up|down|status|throttle`: the local standalone cluster from the shell.

The verbs of `tailguard broker` and `tailguard services`: `down` with no cluster running says so
and exits 0; `status` exits 0 when the master and every worker are up, 1 otherwise; `--work-dir`
goes before or after the verb. The cluster outlives the command; later calls find it through
`<work-dir>/cluster.json`.
A slow node comes in two modes (`--mode`, `--throttle-mode`): `cpu` pauses the worker's
process tree in a duty cycle (honest only with no more executors than cores), `io` sets the
host's factor that I/O-bound tasks read (`tailguard.cluster.slowness`).
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any

from tailguard.cluster.local import (
    DEFAULT_WORK_DIR,
    STATE_FILE,
    THROTTLE_MODES,
    ClusterError,
    LocalCluster,
    ThrottleWarning,
)
from tailguard.cluster.throttle import parse_duration


def _host_factor(text: str) -> tuple[str, float]:
    host, sep, factor = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected HOST=FACTOR, got {text!r}")
    try:
        return host, float(factor)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"bad factor in {text!r}") from exc


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"bad duration {text!r} (e.g. 30s, 2m)") from exc


def _add_work_dir(parser: argparse.ArgumentParser, default: Any) -> None:
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=default,
        help=f"state file, logs and worker dirs (default: {DEFAULT_WORK_DIR})",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _add_work_dir(parser, DEFAULT_WORK_DIR)
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True

    up = actions.add_parser("up", help="start the cluster (or reuse a running one of this shape)")
    up.add_argument("--workers", type=int, default=3, help="workers on 127.0.0.2, .3, ...")
    up.add_argument("--cores", type=int, default=1, help="cores per worker")
    up.add_argument("--memory", default="1g", help="memory per worker (Spark size, e.g. 1g)")
    up.add_argument(
        "--throttle",
        type=_host_factor,
        action="append",
        default=[],
        metavar="HOST=FACTOR",
        help="slow a worker down once the cluster is up (repeatable); in cpu mode an executor "
        "started on a throttled node registers late",
    )
    up.add_argument(
        "--throttle-mode",
        choices=THROTTLE_MODES,
        default="cpu",
        help="mode of every --throttle: cpu (pause the process tree; default) or io (the "
        "factor I/O-bound tasks read)",
    )
    up.add_argument(
        "--cpu-budgets",
        action="store_true",
        help="give each worker a cgroup CPU quota of its share of this machine's CPUs, so a "
        "cpu-mode throttle cuts the quota and the node really loses capacity however many "
        "workers share the CPUs (needs root or a delegated cgroup)",
    )
    up.add_argument("--timeout", type=float, default=90.0, help="seconds to wait for workers")

    status = actions.add_parser(
        "status", help="show the running cluster; exit 0 when all of it is up, 1 otherwise"
    )
    status.add_argument("--json", action="store_true", help="machine-readable output")

    down = actions.add_parser("down", help="stop the cluster and every throttler")

    throttle = actions.add_parser("throttle", help="slow a worker down, or stop doing so")
    for verb in (up, status, down, throttle):
        # After the verb too, as with broker and services; SUPPRESS keeps a --work-dir given
        # before the verb when none follows it.
        _add_work_dir(verb, argparse.SUPPRESS)
    throttle.add_argument("host", help="worker address, e.g. 127.0.0.3")
    which = throttle.add_mutually_exclusive_group(required=True)
    which.add_argument("--factor", type=float, help="run FACTOR times slower (>= 1)")
    which.add_argument("--off", action="store_true", help="stop throttling this host")
    throttle.add_argument(
        "--for", dest="duration", type=_duration, help="only for this long (e.g. 30s, 2m)"
    )
    throttle.add_argument(
        "--after",
        type=_duration,
        help="io mode: start this long from now (e.g. 6s): a node that turns slow mid-job",
    )
    throttle.add_argument(
        "--mode",
        choices=THROTTLE_MODES,
        default="cpu",
        help="cpu: pause and resume the worker's process tree (default; honest only with no "
        "more executors than cores); io: tasks' I/O-bound waits there take FACTOR times longer",
    )
    throttle.add_argument(
        "--period-ms", type=float, default=100.0, help="cpu mode: duty-cycle period"
    )


def _say(message: str) -> None:
    print(f"tailguard cluster: {message}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    # The cluster reports a misleading CPU throttle through `progress` already.
    warnings.simplefilter("ignore", ThrottleWarning)
    try:
        if args.action == "up":
            return _up(args)
        if args.action == "throttle" and not args.off and args.factor < 1:
            _say(f"error: factor must be >= 1 (1 = not slowed), got {args.factor:g}")
            return 2  # a usage error, found before looking for the cluster
        if args.action == "throttle" and not args.off and args.after and args.mode != "io":
            _say("error: --after is for --mode io only (a cpu-mode throttler would wait alive)")
            return 2
        if args.action == "down" and not (Path(args.work_dir) / STATE_FILE).exists():
            _say(f"no cluster running under {Path(args.work_dir).resolve()}")
            return 0
        cluster = LocalCluster.attach(args.work_dir)
        if args.action == "status":
            return _status(cluster, args.json)
        if args.action == "down":
            cluster._progress = _say
            cluster.stop()
            _say("stopped")
            return 0
        if args.action == "throttle":
            cluster._progress = _say
            return _throttle(cluster, args)
    except ClusterError as exc:
        _say(f"error: {exc}")
        return 1
    raise AssertionError(f"unknown action {args.action}")


def _up(args: argparse.Namespace) -> int:
    cluster = LocalCluster(
        workers=args.workers,
        cores=args.cores,
        memory=args.memory,
        work_dir=args.work_dir,
        start_timeout_s=args.timeout,
        progress=_say,
        cpu_budgets=args.cpu_budgets,
    )
    master_url = cluster.start()
    for host, factor in args.throttle:
        cluster.throttle(host, factor, mode=args.throttle_mode)
        _say(f"throttling {host} x{factor:g} ({args.throttle_mode} mode)")
    print(master_url)
    return 0


def _status(cluster: LocalCluster, as_json: bool) -> int:
    status = cluster.status()
    if as_json:
        print(json.dumps(status, indent=2))
    else:
        print(_format_status(status))
    healthy = status["master_answers"] and all(
        w["running"] and w["registered"] for w in status["workers"]
    )
    return 0 if healthy else 1


def _format_status(status: dict[str, Any]) -> str:
    master = "up" if status["master_answers"] else "NOT ANSWERING"
    lines = [
        f"master   {status['master_url']}  web UI {status['web_ui']}  "
        f"pid {status['master']['pid']}  {master}",
    ]
    for w in status["workers"]:
        state = "ALIVE" if w["registered"] else ("running" if w["running"] else "DOWN")
        line = f"worker   {w['host']:<12} pid {w['pid']:<8} {state}"
        if w["throttle"]:
            t = w["throttle"]
            left = t["seconds_left"]
            starts_in = t.get("starts_in")
            line += (
                f"  throttled x{t['factor']:g} {t['mode']}"
                + ("" if starts_in is None else f" (starts in {starts_in:.0f}s)")
                + ("" if left is None else f" ({left:.0f}s left)")
            )
        lines.append(line)
    if status.get("cpu_budget_cores") is not None:
        lines.append(f"CPU budget {status['cpu_budget_cores']:.2f} CPUs per worker (cgroup quota)")
    return "\n".join(lines)


def _throttle(cluster: LocalCluster, args: argparse.Namespace) -> int:
    if args.off:
        cluster.unthrottle(args.host)
        _say(f"{args.host} runs at full speed")
        return 0
    pid = cluster.throttle(
        args.host, args.factor, args.duration, args.period_ms, args.mode, after_s=args.after
    )
    span = "" if args.duration is None else f" for {args.duration:g}s"
    span += "" if not args.after else f" from {args.after:g}s on"
    how = f"throttler pid {pid}" if pid is not None else "tasks there read the new factor"
    _say(f"throttling {args.host} x{args.factor:g} in {args.mode} mode{span} ({how})")
    return 0
