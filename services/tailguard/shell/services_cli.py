"""`tailguard services up|down|status`: the five services as separate processes."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from pathlib import Path

from tailguard.extras import require
from tailguard.log.kafka_config import faust_credentials, security_settings
from tailguard.logs import add_format_argument
from tailguard.settings_file import load_settings
from tailguard.shell.definition import SERVICE_NAMES
from tailguard.shell.supervisor import ServiceError, running, start, stop


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("up", "down", "status"))
    parser.add_argument(
        "--only",
        help=f"comma-separated subset of {','.join(SERVICE_NAMES)} (default: all five)",
    )
    parser.add_argument("--work-dir", help="default: the tailguard.work-dir setting")
    add_format_argument(parser, default=argparse.SUPPRESS)
    parser.add_argument(
        "--foreground",
        action="store_true",
        help="with up: stay attached and stop the services on Ctrl-C",
    )


def _names(only: str | None) -> list[str]:
    if not only:
        return list(SERVICE_NAMES)
    return [n.strip() for n in only.split(",") if n.strip()]


def run(args: argparse.Namespace) -> int:
    settings = load_settings(getattr(args, "config", None))
    work_dir = Path(args.work_dir or settings["tailguard.work-dir"])
    names = _names(args.only)
    try:
        if args.action == "up":
            require("services")  # the workers import faust: say so here, not in their logs
            # Likewise Kafka settings their faust client cannot honour: once, here.
            faust_credentials(security_settings(settings))
            start(
                work_dir,
                names,
                config=getattr(args, "config", None),
                # --log-format: how the services write their log files.
                log_format=getattr(args, "log_format", None),
            )
            if args.foreground:
                stopped = threading.Event()
                signal.signal(signal.SIGTERM, lambda *_: stopped.set())
                with contextlib.suppress(KeyboardInterrupt):
                    stopped.wait()
                stop(work_dir, names)
            return 0
        if args.action == "down":
            if not stop(work_dir, names):
                print("no service was running")
            return 0
        current = running(work_dir)
        for name in names:
            service = current.get(name)
            if service is None:
                print(f"{name}: not running")
            else:
                state = "ready" if service.healthy() else "starting"
                print(f"{name}: {state}, pid {service.pid}, {service.metrics_url}/metrics")
        return 0 if all(n in current for n in names) else 1
    except ServiceError as err:
        print(f"tailguard services: {err}", file=sys.stderr)
        return 1
