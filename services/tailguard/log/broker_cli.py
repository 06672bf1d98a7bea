"""`tailguard broker up|down|status`: the embedded Kafka-protocol broker.

The same verbs as `tailguard cluster` and `tailguard services`: `up` starts it in the background
(`--foreground`: in this terminal until Ctrl-C), `down` stops it, `status` exits 0 while it runs
and 1 otherwise. The spellings from before (`tailguard broker`, `--stop`, `--status`) still work
and say what replaces them.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path

from tailguard.log.broker import BrokerError, EmbeddedBroker
from tailguard.log.broker_process import serve
from tailguard.log.broker_state import BrokerState, read_state
from tailguard.settings_file import load_settings

IN_MEMORY_NOTE = (
    "note: the embedded broker keeps its data in memory only (at most the newest ~5 MB per "
    "partition); everything on it is lost when it stops. The durable log is the per-job Avro "
    "archive."
)


ACTIONS = ("up", "down", "status")
# The spellings before the verbs, and the verb each one means now.
_OLD_FLAGS = {"stop": "down", "status": "status"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        nargs="?",
        choices=ACTIONS,
        help="up: start in the background (or in this terminal with --foreground); down: stop "
        "it; status: exit 0 while it runs, 1 otherwise",
    )
    parser.add_argument(
        "--foreground", action="store_true", help="with up: run in this terminal until Ctrl-C"
    )
    parser.add_argument(
        "--work-dir",
        metavar="DIR",
        help="where the state file broker.json lives (default: setting tailguard.work-dir)",
    )
    for flag in _OLD_FLAGS:
        parser.add_argument(f"--{flag}", action="store_true", help=argparse.SUPPRESS)


def _action(args: argparse.Namespace) -> str:
    """The verb asked for, saying so where it was asked for the old way."""
    old = [flag for flag in _OLD_FLAGS if getattr(args, flag)]
    if args.action is not None and not old:
        return str(args.action)
    if len(old) > 1 or (old and args.action is not None):
        print("tailguard broker: give one of up, down, status", file=sys.stderr)
        raise SystemExit(2)  # a usage error, as argparse exits for one
    action = _OLD_FLAGS[old[0]] if old else "up"
    given = f"--{old[0]}" if old else "no action"
    instead = f"{action} --foreground" if args.foreground else action
    print(
        f"note: `tailguard broker` with {given} is deprecated: use `tailguard broker {instead}`",
        file=sys.stderr,
    )
    return action


def run(args: argparse.Namespace) -> int:
    action = _action(args)
    settings = load_settings(getattr(args, "config", None))
    work_dir = Path(args.work_dir or settings.get("tailguard.work-dir", "") or "work")
    configured = settings.get("bootstrap.servers", "").strip()
    if configured and action == "up":
        print(
            f"note: bootstrap.servers is set ({configured}): tailguard's clients use that "
            "cluster, not the embedded broker"
        )
    broker = EmbeddedBroker(work_dir)
    try:
        if action == "status":
            return _status(broker)
        if action == "down":
            state = broker.status()
            if broker.stop():
                print(
                    f"stopped the embedded broker (pid {state.pid if state else '?'}); "
                    "its data is gone"
                )
            else:
                print(f"no embedded broker running under {work_dir}")
            return 0
        if args.foreground:
            return _foreground(broker, work_dir)
        was_running = broker.status() is not None
        crashed = None if was_running else read_state(work_dir)
        bootstrap = broker.start()
        state = broker.status()
        pid = state.pid if state else "?"
        verb = "already running" if was_running else "started"
        print(f"embedded broker {verb} (pid {pid}), state file {broker.state_file}")
        print(bootstrap)
        if crashed is not None:
            print(_after_crash(crashed, bootstrap))
        print(IN_MEMORY_NOTE)
        print("stop it with: tailguard broker down")
        return 0
    except BrokerError as err:
        print(f"error: {err}")
        return 1


def _after_crash(crashed: BrokerState, bootstrap: str) -> str:
    """What an operator must know after restarting a broker that died."""
    if crashed.bootstrap == bootstrap:
        return (
            f"the broker before (pid {crashed.pid}) died: this one listens on its address, so "
            "its clients reconnect by themselves; the records it held are gone "
            "(docs/log.md#embedded-broker-restarts)"
        )
    return (
        f"warning: the broker before (pid {crashed.pid}) listened on {crashed.bootstrap}, which "
        "could not be had again: restart its clients (services, running jobs) to reach this one"
    )


def _status(broker: EmbeddedBroker) -> int:
    state = broker.status()
    if state is None:
        print(f"no embedded broker running under {broker.work_dir}")
        return 1
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(state.started_at))
    print(
        f"embedded broker running: pid {state.pid}, bootstrap {state.bootstrap}, started {started}"
    )
    print(IN_MEMORY_NOTE)
    return 0


def _foreground(broker: EmbeddedBroker, work_dir: Path) -> int:
    running = broker.status()
    if running is not None:
        print(f"a broker is already running (pid {running.pid}) at {running.bootstrap}")
        return 1

    def announce(state: BrokerState) -> None:
        print(f"embedded broker running in the foreground (pid {state.pid}); Ctrl-C stops it")
        print(state.bootstrap)
        print(IN_MEMORY_NOTE, flush=True)

    stop = threading.Event()
    # SIGTERM sets `stop`; Ctrl-C arrives as KeyboardInterrupt, after serve() has cleaned up.
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    # A state file left by a crashed broker: listen where its clients look.
    crashed = read_state(work_dir)
    try:
        return serve(work_dir, stop, on_ready=announce, port=crashed.port if crashed else 0)
    except KeyboardInterrupt:
        print("stopped; the broker's data is gone")
        return 0
