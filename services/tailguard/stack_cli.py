"""`tailguard stack up|down|status`: the local stack in one command - the embedded broker (and
its topics), the services, the Spark cluster - brought up the way the demo, the bench and the
pytest harness bring theirs up (tailguard.stack).

`up` starts each part asked for that is not already running under the work dir, with a line per
step, and leaves the stack running (`--no-broker`, `--no-services`, `--no-cluster` leave a part
out); a part that fails is named with where its log is, the parts it started before are stopped
again, and the exit status is 1. `down` stops the cluster, the services and the broker running
under the work dir, newest first. `status` says each part's state and exits 0 only when all three
run. The parts' own commands (`tailguard broker|services|cluster`) keep working on the same
state files.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tailguard import stack
from tailguard.settings_file import load_settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("up", "down", "status"))
    parser.add_argument("--work-dir", help="default: the tailguard.work-dir setting")
    parser.add_argument("--no-broker", action="store_true", help="with up: no embedded broker")
    parser.add_argument(
        "--mock", action="store_true", help="with up: librdkafka's mock broker, not Apache Kafka"
    )
    parser.add_argument("--no-services", action="store_true", help="with up: no services")
    parser.add_argument("--no-cluster", action="store_true", help="with up: no Spark cluster")
    parser.add_argument(
        "--workers", type=int, default=3, help="with up: the cluster's workers (default 3)"
    )


def _say(line: str) -> None:
    print(line, flush=True)


def run(args: argparse.Namespace) -> int:
    config = getattr(args, "config", None)
    settings = load_settings(config)
    work_dir = Path(args.work_dir or settings["tailguard.work-dir"]).resolve()  # SHELL_DEFAULTS
    if args.action == "status":
        return _status(work_dir)
    if args.action == "down":
        stack.down_all(work_dir, _say)
        return 0
    request = stack.StackRequest(
        work_dir,
        broker=not args.no_broker,
        mock_broker=args.mock,
        services=() if args.no_services else None,
        config=Path(config) if config else None,
        cluster=None if args.no_cluster else stack.ClusterSpec(args.workers),
    )
    try:
        stack.up(request, _say)
    except stack.StackError as err:
        print(f"error: {err}")
        return 1
    print(f"stack up under {work_dir}; stop it with: tailguard stack down")
    return 0


def _status(work_dir: Path) -> int:
    found = stack.status(work_dir)
    for part, (_, line) in found.items():
        print(f"{part}: {line}")
    return 0 if all(ok for ok, _ in found.values()) else 1
