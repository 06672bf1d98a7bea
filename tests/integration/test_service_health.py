"""A service's /health follows its broker: 503 with the reason while the broker is gone (killed
with -9), 200 again once it is back on the same address."""

from __future__ import annotations

import os
import signal
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tailguard.broker.embedded import EmbeddedBroker
from tailguard.shell.broker_watch import BrokerWatch
from tailguard.shell.metrics_http import MetricsServer
from tailguard.shell.worker import ServiceState

# Long (make test-long); make test keeps the shorter cases of the same feature.
pytestmark = pytest.mark.long


def health(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


def test_health_is_unhealthy_while_the_broker_is_gone(tmp_path: Path) -> None:
    broker = EmbeddedBroker(tmp_path)
    bootstrap = broker.start()
    # Probed by hand (probe()), not by the watch's thread: each step waits for its own answer.
    watch = BrokerWatch({"bootstrap.servers": bootstrap}, timeout_s=1.0)
    state = ServiceState(watch)
    server = MetricsServer("127.0.0.1", 0, lambda: b"", state.unhealthy)
    server.start()
    try:
        assert health(server.port) == (503, "starting\n")
        state.ready = True
        assert watch.probe().reachable
        assert health(server.port) == (200, "ready\n")

        status = broker.status()
        assert status is not None
        os.kill(status.pid, signal.SIGKILL)
        assert not watch.probe().reachable
        code, body = health(server.port)
        assert code == 503
        assert body.startswith("broker unreachable for ") and "no broker answered" in body

        assert broker.start() == bootstrap  # the same address again
        assert watch.probe().reachable
        assert health(server.port) == (200, "ready\n")
        assert watch.lost_within(60.0)
    finally:
        server.stop()
        broker.stop()
