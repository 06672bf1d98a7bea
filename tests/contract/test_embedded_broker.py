"""The embedded broker's lifecycle, through the API and through `tailguard broker`, on the mock
(`up --mock`, a process of ours and quick to start); Apache Kafka's in test_kafka_broker.py."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaClient

from tailguard.broker.embedded import EmbeddedBroker
from tailguard.kafka import config as kafka_config
from tailguard.kafka.bootstrap import BrokerError, resolve_bootstrap
from tailguard.kafka.broker_state import BrokerState, is_broker_process, write_state
from tailguard.kafka.config import KAFKA_FETCH_WAIT_MS, fetch_wait, is_embedded_cluster
from tailguard.kafka.producer import RecordProducer
from tailguard.kafka.topic_reader import EMBEDDED_FETCH_WAIT_MS, TopicReader
from tailguard.processes.supervised import create_time
from tailguard.shell.broker_watch import BrokerWatch


def tailguard(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tailguard.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not is_broker_process(pid):
            return True
        time.sleep(0.02)
    return False


def test_cli_start_status_stop(tmp_path: Path) -> None:
    work = tmp_path / "w"
    started = tailguard("broker", "up", "--mock", "--work-dir", str(work), cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    assert "deprecated" not in started.stderr
    state = json.loads((work / "broker.json").read_text())
    assert set(state) == {"pid", "bootstrap", "started_at", "kind", "created"}
    assert state["kind"] == "mock"
    try:
        # The process by pid and create time: a later process given its pid is not the broker.
        assert state["created"] == create_time(state["pid"])
        assert state["bootstrap"] in started.stdout.splitlines()
        assert "in memory" in started.stdout and "lost" in started.stdout
        assert is_broker_process(state["pid"])

        # The spelling from before the verbs still starts (here: finds) it, and says so.
        again = tailguard("broker", "--work-dir", str(work), cwd=tmp_path)
        assert again.returncode == 0 and "already running" in again.stdout
        assert "use `tailguard broker up`" in again.stderr
        assert json.loads((work / "broker.json").read_text())["pid"] == state["pid"]

        status = tailguard("broker", "status", "--work-dir", str(work), cwd=tmp_path)
        assert status.returncode == 0
        assert str(state["pid"]) in status.stdout and state["bootstrap"] in status.stdout
        old_status = tailguard("broker", "--status", "--work-dir", str(work), cwd=tmp_path)
        assert old_status.returncode == 0 and old_status.stdout == status.stdout
        assert "use `tailguard broker status`" in old_status.stderr
    finally:
        stopped = tailguard("broker", "down", "--work-dir", str(work), cwd=tmp_path)
    assert stopped.returncode == 0, stopped.stderr
    assert gone(state["pid"])
    assert not (work / "broker.json").exists()
    status = tailguard("broker", "status", "--work-dir", str(work), cwd=tmp_path)
    assert status.returncode == 1 and "no embedded broker" in status.stdout
    old_stop = tailguard("broker", "--stop", "--work-dir", str(work), cwd=tmp_path)
    assert old_stop.returncode == 0 and "no embedded broker running" in old_stop.stdout
    assert "use `tailguard broker down`" in old_stop.stderr
    both = tailguard("broker", "down", "--stop", "--work-dir", str(work), cwd=tmp_path)
    assert both.returncode == 2 and "give one of up, down, status" in both.stderr


@pytest.mark.long
def test_cli_reads_work_dir_from_settings(tmp_path: Path) -> None:
    (tmp_path / "tailguard.toml").write_text('[tailguard]\nwork-dir = "from-toml"\n')
    started = tailguard("broker", "up", "--mock", cwd=tmp_path)
    assert started.returncode == 0, started.stderr
    pid = json.loads((tmp_path / "from-toml" / "broker.json").read_text())["pid"]
    stopped = tailguard("broker", "down", cwd=tmp_path)
    assert stopped.returncode == 0 and gone(pid)


def test_broker_serves_clients_and_stops(tmp_path: Path) -> None:
    broker = EmbeddedBroker(tmp_path, mock=True)
    with broker as bootstrap:
        state = broker.status()
        assert state is not None and state.bootstrap == bootstrap
        settings = {"tailguard.work-dir": str(tmp_path)}
        # Found through the state file when bootstrap.servers is not set.
        assert resolve_bootstrap(settings) == bootstrap
        producer = RecordProducer(settings)
        producer.send_bytes("lifecycle", b"k", b"v")
        producer.flush(10)
        reader = TopicReader(settings, ["lifecycle"], "lifecycle-group")
        try:
            deadline = time.monotonic() + 10
            got = []
            while not got and time.monotonic() < deadline:
                got = reader.poll(0.2)
            assert [m.value() for m in got] == [b"v"]
        finally:
            reader.close()
        # A second start reuses the running broker.
        assert EmbeddedBroker(tmp_path, mock=True).start() == bootstrap
    assert gone(state.pid)
    assert broker.status() is None
    assert EmbeddedBroker(tmp_path, mock=True).stop() is False


def read_all(settings: dict[str, str], group: str) -> tuple[list[bytes | None], object]:
    """What a new reader of the "fetch-wait" topic reads first, and the fetch wait it read with."""
    reader = TopicReader(settings, ["fetch-wait"], group)
    try:
        deadline = time.monotonic() + 10
        got: list = []
        while not got and time.monotonic() < deadline:
            got = reader.poll(0.2)
        return [m.value() for m in got], reader._config["fetch.wait.max.ms"]
    finally:
        reader.close()


async def cluster_id_of(bootstrap: str) -> str | None:
    """The cluster id as a service's broker watch gets it, through an aiokafka client."""
    client = AIOKafkaClient(bootstrap_servers=bootstrap)
    try:
        watch = BrokerWatch(lambda: client, timeout_s=10.0)
        assert (await watch.probe()).reachable
        return watch.cluster_id
    finally:
        await client.close()


@pytest.mark.long
def test_the_embedded_broker_is_told_apart_by_its_cluster_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fetch wait follows the broker: the embedded broker answers an empty fetch only when
    the wait expires, so its clients wait briefly; on Kafka a reader takes Kafka's default."""
    with EmbeddedBroker(tmp_path, mock=True) as bootstrap:
        settings = {"bootstrap.servers": bootstrap}  # as a user would name any broker
        cluster_id = asyncio.run(cluster_id_of(bootstrap))
        assert is_embedded_cluster(cluster_id), cluster_id
        assert fetch_wait(settings, cluster_id, 20).ms == 20

        producer = RecordProducer(settings)
        producer.send_bytes("fetch-wait", b"k", b"v")
        producer.flush(10)
        assert read_all(settings, "on-embedded") == ([b"v"], EMBEDDED_FETCH_WAIT_MS)

        # The same broker taken for Kafka: the reader starts again with Kafka's wait before it
        # reads anything, and still reads every record.
        monkeypatch.setattr(kafka_config, "EMBEDDED_CLUSTER_PREFIX", "no-such-prefix")
        assert read_all(settings, "on-kafka") == ([b"v"], KAFKA_FETCH_WAIT_MS)
        # A wait in the settings stays whatever the broker.
        configured = {**settings, "kafka.consumer.fetch.wait.max.ms": "50"}
        assert read_all(configured, "configured") == ([b"v"], "50")


def test_stale_state_file_is_replaced(tmp_path: Path) -> None:
    # A pid that is certainly dead: a child we started and reaped.
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    write_state(tmp_path, BrokerState(pid=child.pid, bootstrap="127.0.0.1:1", started_at=0.0))
    broker = EmbeddedBroker(tmp_path, mock=True)
    assert broker.status() is None
    with pytest.raises(BrokerError, match="tailguard broker"):
        resolve_bootstrap({"tailguard.work-dir": str(tmp_path)})
    with broker as bootstrap:
        # On the dead broker's port where it can be had (tests/contract/test_broker_restart.py).
        assert bootstrap.startswith("127.0.0.1:")
        state = broker.status()
        assert state is not None and state.pid not in (child.pid, os.getpid())


def test_state_file_of_a_foreign_live_process_is_not_trusted(tmp_path: Path) -> None:
    # Our own pid is alive but is no broker: never report it as one (or signal it on --stop).
    write_state(tmp_path, BrokerState(pid=os.getpid(), bootstrap="127.0.0.1:1", started_at=0.0))
    assert EmbeddedBroker(tmp_path, mock=True).status() is None
    assert EmbeddedBroker(tmp_path, mock=True).stop() is False


def test_bootstrap_servers_setting_wins(tmp_path: Path) -> None:
    settings = {"bootstrap.servers": "kafka:9092", "tailguard.work-dir": str(tmp_path)}
    assert resolve_bootstrap(settings) == "kafka:9092"


def _as_a_background_job() -> None:
    # What a shell does to a job it starts with `&`; Python then keeps SIGINT ignored.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.long
@pytest.mark.parametrize("background", [False, True], ids=["terminal", "started-with-&"])
def test_cli_foreground_until_interrupted(tmp_path: Path, background: bool) -> None:
    work = tmp_path / "fg"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tailguard.cli",
            "broker",
            "up",
            "--mock",
            "--foreground",
            "--work-dir",
            str(work),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_as_a_background_job if background else None,
    )
    try:
        deadline = time.monotonic() + 30
        while EmbeddedBroker(work, mock=True).status() is None and time.monotonic() < deadline:
            assert process.poll() is None, process.communicate()
            time.sleep(0.02)
        state = EmbeddedBroker(work, mock=True).status()
        assert state is not None and state.pid == process.pid
        process.send_signal(signal.SIGINT)  # Ctrl-C
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err
    assert state.bootstrap in out
    assert not (work / "broker.json").exists()


@pytest.mark.long
def test_concurrent_starts_share_one_broker(tmp_path: Path) -> None:
    results: list[str] = []
    threads = [
        threading.Thread(target=lambda: results.append(EmbeddedBroker(tmp_path, mock=True).start()))
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    broker = EmbeddedBroker(tmp_path, mock=True)
    state = broker.status()
    try:
        assert state is not None
        assert results == [state.bootstrap] * 3
    finally:
        broker.stop()


@pytest.mark.long
def test_resume_past_trimmed_records_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The embedded broker keeps only the newest ~5 MB of a partition: a group that resumes
    after more than that was written skips ahead, and says so."""

    def read(reader: TopicReader, expected: int) -> list[int]:
        offsets: list[int] = []
        deadline = time.monotonic() + 20
        while len(offsets) < expected and time.monotonic() < deadline:
            offsets.extend(m.offset() or 0 for m in reader.poll(0.2))
        return offsets

    with EmbeddedBroker(tmp_path, mock=True) as bootstrap:
        settings = {"bootstrap.servers": bootstrap}
        producer = RecordProducer(settings)
        for i in range(10):
            producer.send_bytes("trimmed", b"one-key", str(i).encode())
        producer.flush(10)
        reader = TopicReader(settings, ["trimmed"], "behind")
        assert read(reader, 10) == list(range(10))
        reader.commit()
        reader.close()

        for _ in range(12_000):  # 12 MB on one partition
            producer.send_bytes("trimmed", b"one-key", b"x" * 1000)
        producer.flush(30)
        reader = TopicReader(settings, ["trimmed"], "behind")
        with caplog.at_level(logging.WARNING, logger="tailguard.kafka.topic_reader"):
            first = read(reader, 1)[0]
        reader.close()
    assert first > 10
    assert f"records 10..{first - 1} were gone" in caplog.text
