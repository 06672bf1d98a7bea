"""A service's /health follows its broker: 503 with the reason while the broker is gone (killed
with -9), 200 again once it is back on the same address. The service is a real process, as
`tailguard services up` starts it: its /health is a view of its faust app's web server, and the
broker watch behind it probes through the app's own aiokafka client."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tailguard.broker.embedded import EmbeddedBroker
from tailguard.shell import supervisor

# Long (make test-long); make test keeps the shorter cases of the same feature.
pytestmark = pytest.mark.long

# Polled, as `services up` and a monitoring system poll /health: the process has no other way
# to call back.
POLL_S = 0.2


def health_until(work: Path, wanted: str, timeout_s: float) -> str:
    """The detector's /health, polled until it starts with `wanted`; the last answer."""
    deadline = time.monotonic() + timeout_s
    said = ""
    while time.monotonic() < deadline:
        running = supervisor.running(work).get("detector")
        assert running is not None, "the detector is no longer running"
        said = running.health(timeout=5.0)
        if said.startswith(wanted):
            return said
        time.sleep(POLL_S)
    raise AssertionError(f"/health never said {wanted!r}; last: {said!r}")


def test_health_is_unhealthy_while_the_broker_is_gone(tmp_path: Path) -> None:
    # A shared 2-core machine at load 50 took more than the default 120 s to start Kafka.
    broker = EmbeddedBroker(tmp_path, start_timeout_s=600.0)
    bootstrap = broker.start()
    try:
        supervisor.start(tmp_path, ["detector"], report=lambda _line: None, timeout_s=180.0)
        assert health_until(tmp_path, "ready", 10.0) == "ready"

        status = broker.status()
        assert status is not None
        os.kill(status.pid, signal.SIGKILL)
        said = health_until(tmp_path, "broker unreachable for ", 60.0)
        assert "no broker answered" in said

        assert broker.start() == bootstrap  # the same address again
        assert health_until(tmp_path, "ready", 180.0) == "ready"
    finally:
        supervisor.stop(tmp_path, ["detector"], report=lambda _line: None)
        broker.stop()
