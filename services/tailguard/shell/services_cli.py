"""`tailguard services up|down|status|run`: the services of the table (tailguard.system.services) as
separate processes.

`up`, `down` and `status` manage background processes (the verbs of `tailguard broker` and
`tailguard cluster`; `status` exits 0 when every named service runs and is ready, 1 otherwise,
and says why one is not: starting, or its broker unreachable). `run NAME` runs one service in
this process, in the foreground, logging to standard error until SIGTERM or Ctrl-C: what a
container's command is (compose/docker-compose.yml).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tailguard.broker.acls import service_principal
from tailguard.broker.secure import SecureBrokerError, login_environment
from tailguard.extras import require
from tailguard.kafka.config import (
    configured_fetch_wait_ms,
    faust_credentials,
    security_settings,
)
from tailguard.logs import add_format_argument
from tailguard.processes.signals import stop_on_signals
from tailguard.settings_file import load_settings
from tailguard.shell.supervisor import ServiceError, running, start, stop
from tailguard.system.services import SERVICE_NAMES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("up", "down", "status", "run"))
    parser.add_argument(
        "name", nargs="?", metavar="NAME", help=f"with run: one of {', '.join(SERVICE_NAMES)}"
    )
    parser.add_argument(
        "--only",
        help=f"comma-separated subset of {','.join(SERVICE_NAMES)} (default: all)",
    )
    parser.add_argument("--work-dir", help="default: the tailguard.work-dir setting")
    add_format_argument(parser, default=argparse.SUPPRESS)
    parser.add_argument(
        "--foreground",
        action="store_true",
        help="with up: stay attached and stop the services on Ctrl-C",
    )
    parser.add_argument(
        "--logins",
        metavar="DIR",
        help="with up: each service logs in to Kafka as its own principal, tailguard-<service>, "
        "its password read from DIR/tailguard-<service> (`tailguard broker up --secure` makes "
        "them in <work-dir>/kafka/secure/credentials; or your secrets mount)",
    )
    parser.add_argument(
        "--instances",
        type=int,
        default=1,
        metavar="N",
        help="with up: N instances of each service that scales out, sharing its topic's "
        "partitions in one consumer group (the blocklist runs one; docs/services.md)",
    )
    parser.add_argument(
        "--instance",
        type=int,
        default=1,
        metavar="K",
        help="with run: which instance of the service this one is (its files' names: NAME-K); "
        "the consumer group is the service's",
    )
    parser.add_argument(
        "--metrics-port", type=int, default=0, help="with run: metrics port (0: a free one)"
    )
    parser.add_argument("--metrics-host", default="127.0.0.1", help="with run: metrics address")


def _logins(directory: str | None, names: list[str]) -> dict[str, dict[str, str]]:
    """`--logins DIR`: each service's Kafka login (environment variables naming its principal
    and its password file), so every service is a principal of its own (docs/security.md)."""
    if directory is None:
        return {}
    return {name: login_environment(Path(directory), service_principal(name)) for name in names}


def _names(only: str | None) -> list[str]:
    if not only:
        return list(SERVICE_NAMES)
    return [n.strip() for n in only.split(",") if n.strip()]


def _run_one(args: argparse.Namespace) -> int:
    """`services run NAME`: the worker a background service runs, in this process."""
    if args.name not in SERVICE_NAMES:
        given = f"{args.name!r} is not a service" if args.name else "run needs a NAME"
        print(f"tailguard services: {given}: one of {', '.join(SERVICE_NAMES)}", file=sys.stderr)
        return 2
    require("services")
    from tailguard.shell import worker

    argv = [args.name, "--metrics-port", str(args.metrics_port)]
    if args.instance != 1:
        argv += ["--instance", str(args.instance)]
    argv += ["--metrics-host", args.metrics_host]
    for flag, value in (
        ("--config", getattr(args, "config", None)),
        ("--work-dir", args.work_dir),
        ("--log-format", getattr(args, "log_format", None)),
    ):
        if value:
            argv += [flag, value]
    return worker.main(argv)


def run(args: argparse.Namespace) -> int:
    if args.action == "run":
        return _run_one(args)
    if args.name:
        print(
            f"tailguard services: NAME goes with run; {args.action} takes --only {args.name}",
            file=sys.stderr,
        )
        return 2
    settings = load_settings(getattr(args, "config", None))
    work_dir = Path(args.work_dir or settings["tailguard.work-dir"])
    names = _names(args.only)
    try:
        if args.action == "up":
            require("services")  # the workers import faust: say so here, not in their logs
            logins = _logins(args.logins, names)
            # Likewise Kafka settings their faust client cannot honour: once, here.
            for login in logins.values() or [{}]:
                with_login = load_settings(
                    getattr(args, "config", None), environ={**os.environ, **login}
                )
                faust_credentials(security_settings(with_login))
            configured_fetch_wait_ms(settings)
            start(
                work_dir,
                names,
                config=getattr(args, "config", None),
                # --log-format: how the services write their log files.
                log_format=getattr(args, "log_format", None),
                env_of=lambda name: logins.get(name, {}),
                count=args.instances,
            )
            if args.foreground:
                stop_on_signals().wait()
                stop(work_dir, names)
            return 0
        if args.action == "down":
            if not stop(work_dir, names):
                print("no service was running")
            return 0
        current = running(work_dir)
        healthy = True
        for name in names:
            if name not in current:
                print(f"{name}: not running")
            for service in (s for s in current.values() if s.service == name):
                health = service.health()
                healthy = healthy and health == "ready"
                print(f"{service.name}: {health}, pid {service.pid}, {service.metrics_url}/metrics")
        return 0 if healthy and all(n in current for n in names) else 1
    except (ServiceError, SecureBrokerError) as err:
        print(f"tailguard services: {err}", file=sys.stderr)
        return 1
