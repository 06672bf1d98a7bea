"""One supervised process (tailguard.processes.supervised), as the broker, the services and the
cluster keep theirs: a real child started detached with its log, its state file, its health
endpoint, its stop; a state file naming a dead process, and one whose pid another process has.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tailguard.kafka.broker_state import BrokerState
from tailguard.processes import supervised
from tailguard.processes.supervised import Supervised

# A child that serves /health ("starting" until the file it is given exists, then "ready") on a
# port of its own, says the port in its log, and exits 0 on SIGTERM (or ignores SIGTERM).
CHILD = textwrap.dedent(
    """
    import http.server, os, signal, sys
    ready_file, on_term = sys.argv[1], sys.argv[2]
    if on_term == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            ready = os.path.exists(ready_file)
            self.send_response(200 if ready else 503)
            self.end_headers()
            self.wfile.write(b"ready" if ready else b"starting")

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    print(f"port {server.server_port}", flush=True)
    server.serve_forever()
    """
)


def _start(tmp_path: Path, on_term: str = "exit") -> tuple[Supervised, Path]:
    """The child, started and recorded as a supervisor records it; the file that makes it
    ready."""
    log = tmp_path / "child.log"
    ready = tmp_path / "ready"
    argv = [sys.executable, "-c", CHILD, str(ready), on_term]
    process = supervised.launch(argv, log)
    # The port is known once the child has bound it and said so in its log.
    assert supervised.wait_until(lambda: "port " in log.read_text(), 30.0), log.read_text()
    port = int(log.read_text().split("port ")[1].split()[0])
    record = Supervised.of(process.pid, argv, log, f"http://127.0.0.1:{port}/health")
    return record, ready


@pytest.fixture
def started(tmp_path: Path) -> Iterator[tuple[Supervised, Path]]:
    record, ready = _start(tmp_path)
    yield record, ready
    supervised.stop_all([record], grace_s=1.0)


def test_a_started_process_is_recorded_found_healthy_and_stopped(
    tmp_path: Path, started: tuple[Supervised, Path]
) -> None:
    record, ready = started
    state = tmp_path / "state" / "child.json"
    supervised.write_json(state, {**record.to_dict(), "extra": "kept"})
    raw = supervised.read_json(state)
    assert raw is not None and raw["extra"] == "kept"
    assert [p.name for p in state.parent.iterdir()] == ["child.json"]  # no temporary left
    found = Supervised.from_dict(raw)
    assert found == record
    assert found.created > 0 and found.command[0] == sys.executable
    # Its own session: a Ctrl-C to the launching terminal's group does not reach it.
    assert os.getsid(found.pid) == found.pid
    assert found.ours()
    assert found.health() == "starting"
    ready.touch()
    assert found.health() == "ready"
    assert found.stop(grace_s=10.0)  # SIGTERM sufficed
    assert not found.ours() and not supervised.alive(found.pid)
    assert found.health().startswith("no answer from")


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    record, _ = _start(tmp_path, on_term="ignore")
    try:
        assert record.ours()
        assert supervised.stop_all([record], grace_s=0.5) == {record.pid}
        assert not supervised.alive(record.pid)
    finally:
        supervised.stop_all([record], grace_s=0.1)


def test_a_stale_state_file_with_a_dead_pid_is_not_ours(tmp_path: Path) -> None:
    record, _ = _start(tmp_path)
    assert record.stop(grace_s=10.0)
    state = tmp_path / "child.json"
    supervised.write_json(state, record.to_dict())
    stale = Supervised.from_dict(supervised.read_json(state) or {})
    assert not stale.ours()
    assert not stale.ours("-c")  # with or without a command-line marker
    assert supervised.stop_all([stale], grace_s=0.1) == set()  # nothing to signal
    assert stale.health().startswith("no answer from")


def test_a_pid_reused_by_another_process_is_not_ours_and_never_signalled() -> None:
    # This test's own process stands for the one that got a dead supervised process's pid: the
    # same pid, another create time. Signalling it would end this test run.
    me = os.getpid()
    created = supervised.create_time(me)
    assert created is not None
    reused = Supervised(me, created - 1.0, ("java", "kafka.Kafka"))
    assert not reused.ours()
    assert supervised.stop_all([reused], grace_s=0.1) == set()
    assert Supervised(me, created).ours()  # the very process is
    # A state file from before create times were recorded: the command line decides.
    assert not Supervised(me).ours("kafka.Kafka")
    assert Supervised(me).ours(lambda line: any("pytest" in arg for arg in line))


def test_a_state_file_from_an_older_release_reads_with_defaults(tmp_path: Path) -> None:
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"pid": 12345, "metrics_url": "http://127.0.0.1:1"}))
    raw = supervised.read_json(path)
    assert raw is not None
    assert Supervised.from_dict(raw) == Supervised(12345)
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="no JSON object"):
        supervised.read_json(path)
    assert supervised.read_json(tmp_path / "missing.json") is None


def test_the_brokers_state_names_its_process_by_pid_and_create_time() -> None:
    me = os.getpid()
    created = supervised.create_time(me) or 0.0
    # This pytest process is no broker: by its create time it is the recorded one, but a
    # reused pid recorded with another create time, or with none, is not a broker.
    assert BrokerState(me, "127.0.0.1:9092", 0.0, "kafka", created).ours()
    assert not BrokerState(me, "127.0.0.1:9092", 0.0, "kafka", created + 1.0).ours()
    assert not BrokerState(me, "127.0.0.1:9092", 0.0, "kafka").ours()
