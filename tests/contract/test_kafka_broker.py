"""Apache Kafka as the embedded broker: `tailguard broker up|down`, its log kept across a stop
and a kill -9, `--purge`, the address asked for, and tailguard's topics with their settings.

One broker for the whole test (each start of the JVM costs ~10 s on 2 cores)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from tailguard.broker.kafka_server import DATA_DIR, KAFKA_DIR
from tailguard.kafka.broker_state import is_broker_process, read_state
from tailguard.kafka.topics import declared_topics
from tailguard.model.fleet import BLOCKLIST_TOPIC
from tailguard.model.records import EVENTS_TOPIC

# Long (make test-long); make test keeps the shorter cases of the same feature.
pytestmark = pytest.mark.long


def cli(work: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tailguard.cli", "broker", *args, "--work-dir", str(work)],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip


def produced(bootstrap: str, topic: str, value: bytes) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, key=b"job", value=value)
    assert producer.flush(30) == 0


def held(bootstrap: str, topic: str) -> list[bytes]:
    """Every value of partition 0..3 of `topic`, read from the start up to its end now."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4().hex[:8]}",
         "enable.partition.eof": True, "log_level": 3}
    )  # fmt: skip
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        values, ended = [], set()
        while len(ended) < len(partitions):
            message = consumer.poll(10)
            assert message is not None, f"no record nor end of partition in 10 s: {ended}"
            if message.error():
                ended.add(message.partition())
            else:
                values.append(message.value())
        return values
    finally:
        consumer.close()


def kill_9(work: Path) -> None:
    state = read_state(work)
    assert state is not None and state.kind == "kafka"
    exited = os.pidfd_open(state.pid)  # not our child: its exit is awaited through a pidfd
    os.kill(state.pid, signal.SIGKILL)
    assert select.select([exited], [], [], 10)[0], "the broker outlived kill -9"
    os.close(exited)


def test_kafka_broker_keeps_its_log_across_down_up_and_kill_9(tmp_path: Path) -> None:
    work = tmp_path / "w"
    up = cli(work, "up", "--listen", "127.0.0.3:0")
    assert up.returncode == 0, up.stdout + up.stderr
    state = read_state(work)
    assert state is not None and state.kind == "kafka" and is_broker_process(state.pid)
    # Listening on the address asked for, and advertising it.
    assert state.bootstrap.startswith("127.0.0.3:") and state.bootstrap in up.stdout.splitlines()
    assert "formatting the broker's storage" in up.stdout and "created topics" in up.stdout
    try:
        admin = AdminClient({"bootstrap.servers": state.bootstrap})
        [broker] = admin.list_topics(timeout=10).brokers.values()
        assert f"{broker.host}:{broker.port}" == state.bootstrap
        topics = admin.list_topics(timeout=10).topics
        for spec in declared_topics():
            assert len(topics[spec.name].partitions) == spec.partitions
        [(_, described)] = admin.describe_configs(
            [ConfigResource(ConfigResource.Type.TOPIC, BLOCKLIST_TOPIC)]
        ).items()
        assert described.result(10)["cleanup.policy"].value == "compact"

        produced(state.bootstrap, EVENTS_TOPIC, b"before down")
        down = cli(work, "down")
        assert down.returncode == 0 and "its data is kept" in down.stdout
        again = cli(work, "up")
        assert again.returncode == 0, again.stdout + again.stderr
        assert "formatting" not in again.stdout
        restarted = read_state(work)
        assert restarted is not None and restarted.bootstrap == state.bootstrap
        assert held(state.bootstrap, EVENTS_TOPIC) == [b"before down"]

        produced(state.bootstrap, EVENTS_TOPIC, b"before kill")
        kill_9(work)
        after_kill = cli(work, "up")
        assert after_kill.returncode == 0, after_kill.stdout + after_kill.stderr
        assert "recovered its log from disk" in after_kill.stdout
        assert held(state.bootstrap, EVENTS_TOPIC) == [b"before down", b"before kill"]
    finally:
        purged = cli(work, "down", "--purge")
    assert purged.returncode == 0 and "its data is gone" in purged.stdout
    assert not (work / KAFKA_DIR / DATA_DIR).exists()
