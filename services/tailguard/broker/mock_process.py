"""The embedded broker's own process: holds librdkafka's mock cluster until SIGTERM/SIGINT.

librdkafka's mock cluster lives exactly as long as the client handle that created it, so this
process holds one (`mock_listener.py`). With a port given (the one a crashed broker recorded),
the cluster listens there, so the clients of the crashed broker find the new one. The
bootstrap address is written to `<work_dir>/broker.json` atomically (write to a
temporary file, then rename) so a reader never sees a half-written state file. On SIGTERM or
SIGINT the state file is removed and the process exits with status 0.

Run as `python -m tailguard.broker.mock_process WORK_DIR [PORT]`.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tailguard.broker.mock_listener import MockCluster, start_mock_cluster
from tailguard.kafka.broker_state import BrokerState, remove_state, write_state
from tailguard.processes.signals import stop_on_signals
from tailguard.processes.supervised import create_time

log = logging.getLogger(__name__)


def hold_cluster(port: int) -> MockCluster:
    """The mock cluster on `port` if it is free, else on a new port (said in the log: the
    clients of the broker before then will not find this one)."""
    if port:
        try:
            return start_mock_cluster(port)
        except OSError as err:
            log.warning(
                "port %d (where the previous broker listened) cannot be had (%s): listening on "
                "a new port; clients of the previous broker must be restarted",
                port, err.strerror or err,
            )  # fmt: skip
    return start_mock_cluster()


def serve(
    work_dir: Path,
    stop: threading.Event,
    on_ready: Callable[[BrokerState], None] | None = None,
    *,
    port: int = 0,
) -> int:
    """Hold the cluster (on `port`, if free) and its state file until `stop` is set;
    `on_ready` is called once the state file is written."""
    cluster = hold_cluster(port)
    state = BrokerState(
        pid=os.getpid(),
        bootstrap=cluster.bootstrap,
        started_at=time.time(),
        created=create_time(os.getpid()) or 0.0,
    )
    write_state(work_dir, state)
    try:
        if on_ready is not None:
            on_ready(state)
        stop.wait()
    finally:
        remove_state(work_dir, only_pid=state.pid)
        cluster.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 2) or (len(args) == 2 and not args[1].isdigit()):
        print("usage: python -m tailguard.broker.mock_process WORK_DIR [PORT]", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    stop = stop_on_signals()
    return serve(Path(args[0]), stop, port=int(args[1]) if len(args) == 2 else 0)


if __name__ == "__main__":
    sys.exit(main())
