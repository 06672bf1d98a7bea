"""One Kafka client per service process (issue 26): a ready service talks to Kafka only through
its faust app's aiokafka client. librdkafka is left only where the worker's comments say why:
the state load before the stream (its client is closed once the state is loaded, before the
service turns ready), the carry-over after a lost broker, and the catch-up on a partition taken
over from another instance.

librdkafka names each thread it runs (rdk:main, rdk:broker<N>, rdk:bg: rd_kafka_set_thread_name
in rdkafka.c), and every client has its rdk:main thread while it lives, so the process's thread
names tell whether any librdkafka client is open."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from tailguard.shell import supervisor
from tailguard.testing import Broker

pytestmark = pytest.mark.slow


def librdkafka_threads(pid: int) -> list[str]:
    names = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
        except FileNotFoundError:
            continue  # a thread that ended meanwhile
        if name.startswith("rdk:"):
            names.append(name)
    return sorted(names)


def test_a_ready_service_has_no_librdkafka_client_open(
    tmp_path: Path, tailguard_broker: Broker
) -> None:
    bootstrap = tailguard_broker.bootstrap
    started = supervisor.start(
        tmp_path,
        ["detector"],
        env={"TAILGUARD_BOOTSTRAP_SERVERS": bootstrap},
        report=lambda _line: None,
        timeout_s=180.0,
    )
    pid = started["detector"].pid
    try:
        assert started["detector"].healthy()
        assert librdkafka_threads(pid) == []
        # What it does talk to Kafka with: aiokafka's connections, from the process itself.
        port = int(bootstrap.rsplit(":", 1)[1])
        connections = psutil.Process(pid).net_connections(kind="tcp")
        to_broker = [c for c in connections if c.raddr and c.raddr.port == port]
        assert to_broker, connections
        # Its metrics and health are its faust app's web server's, on the announced port.
        metrics_port = int(started["detector"].metrics_url.rsplit(":", 1)[1])
        listening = [c for c in connections if c.status == psutil.CONN_LISTEN]
        assert [c.laddr.port for c in listening] == [metrics_port]
        assert started["detector"].metrics()["tailguard_service_ready"] == 1.0
    finally:
        supervisor.stop(tmp_path, ["detector"], report=lambda _line: None)
