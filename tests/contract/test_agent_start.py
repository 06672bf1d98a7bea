"""The agent's bounded start: it reads decisions from its job's start on (offsets for times,
less a margin), only its own job's, and never re-files another job's undecodable record."""

from __future__ import annotations

import queue
import time
import uuid
from pathlib import Path

from confluent_kafka import Producer

from tailguard.agent.adapters.kafka import KafkaPublisher
from tailguard.agent.driver.ports import CommandReceived
from tailguard.archive import ArchiveWriter
from tailguard.codec import codec_for
from tailguard.kafka.dead_letters import DeadLetterReader
from tailguard.model import records as r
from tailguard.model.config import Settings

CODEC = codec_for(Settings({}))


def command(job: str, n: int, ts: int) -> r.FailJob:
    return r.FailJob(job_id=job, ts=ts, id=f"{job}-c{n}", reason=f"#{n}")


def test_agent_reads_its_own_decisions_from_its_start(settings: Settings, tmp_path: Path) -> None:
    job, other = f"start-{uuid.uuid4().hex[:8]}", f"other-{uuid.uuid4().hex[:8]}"
    now = int(time.time() * 1000)
    start_at = now - 1_000
    producer = Producer({"bootstrap.servers": settings["bootstrap.servers"], "log_level": 3})

    def send(key: str, value: bytes, ts: int) -> None:
        producer.produce(r.COMMANDS_TOPIC, value, key=key.encode(), timestamp=ts)

    # History from before the job: its own old command (stamped an hour ago), another job's
    # commands and garbage, and garbage of its own from back then.
    send(job, CODEC.encode(command(job, 0, now - 3_600_000)), now - 3_600_000)
    for n in range(50):
        send(other, CODEC.encode(command(other, n, now - 60_000)), now - 60_000)
    send(other, b"\x00undecodable, not ours", now - 60_000)
    send(job, b"\x00undecodable, ours but old", now - 3_600_000)
    # Published after the job started but before its agent's reader exists (nor is assigned).
    send(job, CODEC.encode(command(job, 1, now)), now)
    send(other, b"\x00undecodable, not ours, new", now)
    send(job, b"\x00undecodable, ours", now)
    assert producer.flush(10) == 0

    inbox: queue.Queue[CommandReceived] = queue.Queue()
    failures: list[BaseException] = []
    archive = ArchiveWriter(tmp_path / f"{job}.avro")
    publisher = KafkaPublisher(
        archive, CODEC, settings, job, inbox.put, start_at_ms=start_at, on_failure=failures.append
    )
    try:
        first = inbox.get(timeout=30)
        send(job, CODEC.encode(command(job, 2, now + 1)), now + 1)  # after the reader started
        assert producer.flush(10) == 0
        second = inbox.get(timeout=30)
    finally:
        publisher.close()
    assert [first.command.id, second.command.id] == [f"{job}-c1", f"{job}-c2"]
    assert inbox.empty() and not failures
    # Only its own undecodable record from its time was filed, under its own key.
    with DeadLetterReader(settings, r.COMMANDS_TOPIC) as letters:
        mine = [
            d for d in letters.read(1_000, timeout=3) if d.key in (job.encode(), other.encode())
        ]
    assert [(d.key, d.value) for d in mine] == [(job.encode(), b"\x00undecodable, ours")]


def test_the_decision_reader_dying_is_reported(settings: Settings, tmp_path: Path) -> None:
    job = f"dies-{uuid.uuid4().hex[:8]}"
    died: queue.Queue[BaseException] = queue.Queue()
    publisher = KafkaPublisher(
        ArchiveWriter(tmp_path / f"{job}.avro"), CODEC, settings, job, lambda c: None,
        start_at_ms=int(time.time() * 1000), on_failure=died.put,
    )  # fmt: skip

    def broken(timeout: float = 1.0) -> list[object]:
        raise MemoryError("decoder ran out of memory")

    publisher._consumer.poll = broken  # type: ignore[method-assign]  # a fault, injected
    try:
        error = died.get(timeout=10)
    finally:
        publisher.close()
    assert isinstance(error, MemoryError)
    assert publisher.archive_path.endswith(f"{job}.avro")
