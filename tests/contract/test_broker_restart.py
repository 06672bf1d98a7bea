"""The mock broker killed with -9 comes back on its address, and its clients carry on (Apache
Kafka's broker does that and keeps its log: test_kafka_broker.py)."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tailguard.broker.embedded import EmbeddedBroker
from tailguard.kafka.broker_state import BrokerState, is_broker_process, read_state, write_state


def kill_9(broker: EmbeddedBroker) -> BrokerState:
    state = broker.status()
    assert state is not None
    os.kill(state.pid, signal.SIGKILL)
    os.waitpid(state.pid, 0)  # our child: reaped, so its pid is certainly gone
    assert not is_broker_process(state.pid)
    return state


def read_all(bootstrap: str, topic: str, expected: int) -> list[bytes]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "restart-test", "log_level": 3}
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        values: list[bytes] = []
        for _ in range(100):
            if len(values) >= expected:
                break
            values.extend(
                m.value() or b"" for m in consumer.consume(expected, 0.2) if m.error() is None
            )
        return values
    finally:
        consumer.close()


def test_killed_broker_restarts_on_its_port_and_queued_records_arrive_in_order(
    tmp_path: Path,
) -> None:
    broker = EmbeddedBroker(tmp_path, mock=True)
    bootstrap = broker.start()
    # The agent's settings: records wait in the producer's queue while the broker is gone.
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "message.timeout.ms": 0,
            "reconnect.backoff.max.ms": 500,
            "log_level": 0,
        }
    )
    failed: list[str] = []

    def delivered(err: object, msg: object) -> None:
        if err is not None:
            failed.append(str(err))

    try:
        for i in range(50):
            producer.produce("facts", str(i).encode(), key=b"job", on_delivery=delivered)
        assert producer.flush(10) == 0
        crashed = kill_9(broker)
        for i in range(50, 100):  # produced while no broker runs
            producer.produce("facts", str(i).encode(), key=b"job", on_delivery=delivered)
        producer.poll(0.5)
        assert len(producer) == 50, "delivered with no broker?"

        assert read_state(tmp_path) == crashed, "the dead broker's state file is its address"
        assert broker.start() == bootstrap
        assert producer.flush(30) == 0 and not failed
        # The new broker holds only what came after it started, in the order produced.
        assert read_all(bootstrap, "facts", 50) == [str(i).encode() for i in range(50, 100)]
    finally:
        broker.stop()


@pytest.mark.long
def test_restart_on_a_taken_port_listens_elsewhere_and_says_so(tmp_path: Path) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    taken = holder.getsockname()[1]
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    write_state(tmp_path, BrokerState(child.pid, f"127.0.0.1:{taken}", 0.0))
    broker = EmbeddedBroker(tmp_path, mock=True)
    try:
        bootstrap = broker.start()
        assert bootstrap != f"127.0.0.1:{taken}"
        assert f"port {taken}" in (tmp_path / "broker.log").read_text()
    finally:
        broker.stop()
        holder.close()


@pytest.mark.long
def test_cli_up_after_a_crash_names_what_was_lost(tmp_path: Path) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tailguard.cli", "broker", *args, "--work-dir", str(tmp_path)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    assert cli("up", "--mock").returncode == 0
    state = read_state(tmp_path)
    assert state is not None
    exited = os.pidfd_open(state.pid)  # not our child: its exit is awaited through a pidfd
    os.kill(state.pid, signal.SIGKILL)
    assert select.select([exited], [], [], 10)[0], "the broker outlived kill -9"
    os.close(exited)
    try:
        again = cli("up", "--mock")
        assert again.returncode == 0, again.stdout + again.stderr
        assert state.bootstrap in again.stdout.splitlines()
        assert "reconnect by themselves" in again.stdout and "gone" in again.stdout
    finally:
        cli("down")


@pytest.mark.long
def test_a_reader_follows_a_restarted_broker_to_its_new_log_from_its_start(
    tmp_path: Path,
) -> None:
    """The new log numbers from 0 again. A reader at offset 3 with the new log holding 1 record
    is not out of range (3 > 1 is, 1 == 1 would not be), so librdkafka would wait at its old
    position and never hand out the new log's first records: the reader rewinds itself."""
    from tailguard.kafka.topic_reader import TopicReader

    broker = EmbeddedBroker(tmp_path, mock=True)
    bootstrap = broker.start()
    try:
        producer = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": 0})
        for i in range(3):
            producer.produce("t", f"old-{i}".encode(), b"k", partition=0)
        assert producer.flush(10) == 0
        reader = TopicReader({"bootstrap.servers": bootstrap}, ["t"], "follow-test")
        seen: list[bytes] = []
        for _ in range(100):
            if len(seen) >= 3:
                break
            seen.extend(m.value() or b"" for m in reader.poll(0.2))
        assert seen == [b"old-0", b"old-1", b"old-2"]
        kill_9(broker)
        assert broker.start() == bootstrap
        for i in range(3):  # the new log reaches the reader's old position, and no further
            producer.produce("t", f"new-{i}".encode(), b"k", partition=0)
        assert producer.flush(30) == 0
        seen = []
        for _ in range(150):
            if len(seen) >= 3:
                break
            seen.extend(m.value() or b"" for m in reader.poll(0.2))
        assert seen == [b"new-0", b"new-1", b"new-2"]
        reader.close()
    finally:
        broker.stop()
