"""The embedded broker's own process: holds librdkafka's mock cluster until SIGTERM/SIGINT.

librdkafka's mock cluster (`test.mock.num.brokers`) lives exactly as long as the client that
created it, so this process keeps one idle producer open. Once the cluster answers a metadata
request, the bootstrap address is written to `<work_dir>/broker.json` atomically (write to a
temporary file, then rename) so a reader never sees a half-written state file. On SIGTERM or
SIGINT the state file is removed and the process exits with status 0.

Run as `python -m tailguard.log.broker_process WORK_DIR`.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from confluent_kafka import Producer

from tailguard.log.broker_state import BrokerState, remove_state, write_state

# How long to wait for the mock cluster to answer its first metadata request.
_METADATA_TIMEOUT_S = 10.0


def start_mock_cluster() -> tuple[Producer, str]:
    """A client that holds a one-broker mock cluster, and that cluster's bootstrap address."""
    holder = Producer(
        {
            "test.mock.num.brokers": 1,
            "bootstrap.servers": "",
            # The mock cluster logs a notice on creation; nobody reads it in a daemon.
            "log_level": 3,
        }
    )
    brokers = holder.list_topics(timeout=_METADATA_TIMEOUT_S).brokers
    bootstrap = ",".join(f"{b.host}:{b.port}" for b in brokers.values())
    if not bootstrap:
        raise RuntimeError("the mock cluster reported no brokers")
    return holder, bootstrap


def serve(
    work_dir: Path,
    stop: threading.Event,
    on_ready: Callable[[BrokerState], None] | None = None,
) -> int:
    """Hold the cluster and its state file until `stop` is set; `on_ready` is called once the
    state file is written."""
    holder, bootstrap = start_mock_cluster()
    state = BrokerState(pid=os.getpid(), bootstrap=bootstrap, started_at=time.time())
    write_state(work_dir, state)
    try:
        if on_ready is not None:
            on_ready(state)
        # The holder has nothing to send; polling keeps its callbacks serviced while we wait.
        while not stop.wait(0.5):
            holder.poll(0)
    finally:
        remove_state(work_dir, only_pid=state.pid)
        holder.flush(0)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m tailguard.log.broker_process WORK_DIR", file=sys.stderr)
        return 2
    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    return serve(Path(args[0]), stop)


if __name__ == "__main__":
    sys.exit(main())
