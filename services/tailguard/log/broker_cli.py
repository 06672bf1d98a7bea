"""`tailguard broker`: start, inspect or stop the embedded Kafka-protocol broker."""

from __future__ import annotations

import argparse
import signal
import threading
import time
from pathlib import Path

from tailguard.log.broker import BrokerError, EmbeddedBroker
from tailguard.log.broker_process import serve
from tailguard.log.broker_state import BrokerState
from tailguard.settings_file import load_settings

IN_MEMORY_NOTE = (
    "note: the embedded broker keeps its data in memory only (at most the newest ~5 MB per "
    "partition); everything on it is lost when it stops. The durable log is the per-job Avro "
    "archive."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--stop", action="store_true", help="stop the running broker")
    mode.add_argument("--status", action="store_true", help="show whether a broker is running")
    mode.add_argument(
        "--foreground", action="store_true", help="run the broker in this process until Ctrl-C"
    )
    parser.add_argument(
        "--work-dir",
        metavar="DIR",
        help="where the state file broker.json lives (default: setting tailguard.work-dir)",
    )


def run(args: argparse.Namespace) -> int:
    settings = load_settings(getattr(args, "config", None))
    work_dir = Path(args.work_dir or settings.get("tailguard.work-dir", "") or "work")
    configured = settings.get("bootstrap.servers", "").strip()
    if configured and not (args.stop or args.status):
        print(
            f"note: bootstrap.servers is set ({configured}): tailguard's clients use that "
            "cluster, not the embedded broker"
        )
    broker = EmbeddedBroker(work_dir)
    try:
        if args.status:
            return _status(broker)
        if args.stop:
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
        bootstrap = broker.start()
        state = broker.status()
        pid = state.pid if state else "?"
        verb = "already running" if was_running else "started"
        print(f"embedded broker {verb} (pid {pid}), state file {broker.state_file}")
        print(bootstrap)
        print(IN_MEMORY_NOTE)
        print("stop it with: tailguard broker --stop")
        return 0
    except BrokerError as err:
        print(f"error: {err}")
        return 1


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
    try:
        return serve(work_dir, stop, on_ready=announce)
    except KeyboardInterrupt:
        print("stopped; the broker's data is gone")
        return 0
