"""The log's contract, the same for every backend: order, resume, dead letters, archive."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tailguard.archive import ArchiveReader, ArchiveWriter, Direction
from tailguard.kafka.consumer import Consumed, RecordConsumer
from tailguard.kafka.dead_letters import DeadLetterReader
from tailguard.kafka.producer import DeliveryError, RecordProducer
from tailguard.model.config import Settings
from tailguard.model.records import AttemptFinished, Record, Tick

# A consumer's first records can take a few seconds: joining the group (the mock cluster delays
# the first rebalance by 3 s) and, for a topic created after subscribing, a metadata refresh.
DEADLINE_S = 30.0


def make_records(jobs: int, per_job: int, start_ts: int = 1_000) -> list[Record]:
    """Records of several jobs, interleaved the way concurrent jobs' events would be."""
    out: list[Record] = []
    for seq in range(per_job):
        for j in range(jobs):
            job = f"job-{j}"
            ts = start_ts + seq
            if seq % 3 == 2:
                out.append(
                    AttemptFinished(
                        job_id=job, ts=ts, id=f"{job}-e{seq}", vertex="map", subtask=seq,
                        attempt=0, host="127.0.0.2", input_bytes=1024 * seq, records=seq,
                        bytes_per_subpartition=(seq, seq + 1), checksums=("c0", "c1"),
                    )
                )  # fmt: skip
            else:
                out.append(Tick(job_id=job, ts=ts, id=f"{job}-e{seq}"))
    return out


def drain(consumer: RecordConsumer, expected: int, timeout_s: float = DEADLINE_S) -> list[Consumed]:
    """Poll until `expected` records have arrived (or the deadline passes)."""
    deadline = time.monotonic() + timeout_s
    got: list[Consumed] = []
    while len(got) < expected and time.monotonic() < deadline:
        got.extend(consumer.poll(0.2))
    return got


def publish(settings: Settings, codec: Any, topic: str, records: list[Record]) -> None:
    producer = RecordProducer(settings, codec)
    for record in records:
        producer.send(record, topic)
    producer.flush(10)


def ids_by_job(consumed: list[Consumed]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for c in consumed:
        out.setdefault(c.record.job_id, []).append(c.record.id)
    return out


def test_per_key_order(settings: Settings, codec: Any, topic: str, group_id: str) -> None:
    records = make_records(jobs=5, per_job=400)
    publish(settings, codec, topic, records)
    with RecordConsumer(settings, codec, [topic], group_id) as consumer:
        got = drain(consumer, len(records))
    assert len(got) == len(records)
    expected = {r.job_id: [] for r in records}
    for r in records:
        expected[r.job_id].append(r.id)
    assert ids_by_job(got) == expected
    # Same key, same partition: that is what carries the order.
    partitions = {(c.record.job_id, c.partition) for c in got}
    assert len(partitions) == len(expected)
    # Records come back equal to what was sent, with their raw bytes.
    by_id = {r.id + r.job_id: r for r in records}
    assert all(by_id[c.record.id + c.record.job_id] == c.record for c in got)
    assert all(codec.decode(c.raw) == c.record and c.topic == topic for c in got)


def test_consumer_subscribed_before_topic_exists(
    settings: Settings, codec: Any, topic: str, group_id: str
) -> None:
    with RecordConsumer(settings, codec, [topic], group_id) as consumer:
        assert consumer.poll(0.5) == []  # the topic does not exist yet
        records = make_records(jobs=2, per_job=10)
        publish(settings, codec, topic, records)
        got = drain(consumer, len(records))
    assert sorted(c.record.id for c in got) == sorted(r.id for r in records)


def test_group_resumes_from_committed_offsets(
    settings: Settings, codec: Any, topic: str, group_id: str
) -> None:
    first = make_records(jobs=1, per_job=100)
    publish(settings, codec, topic, first)
    consumer = RecordConsumer(settings, codec, [topic], group_id, max_batch=10)
    committed = drain(consumer, 30)
    consumer.commit()
    # Read past the commit but do not commit: a restart must deliver these again.
    uncommitted = drain(consumer, 10)
    consumer.close()
    assert len(committed) >= 30 and uncommitted

    later = make_records(jobs=1, per_job=20, start_ts=10_000)
    later = [Tick(job_id=r.job_id, ts=r.ts, id=f"later-{r.id}") for r in later]
    publish(settings, codec, topic, later)
    rest = len(first) + len(later) - len(committed)
    with RecordConsumer(settings, codec, [topic], group_id) as restarted:
        resumed = drain(restarted, rest)
    resumed_ids = [c.record.id for c in resumed]
    assert resumed_ids == [r.id for r in first[len(committed) :]] + [r.id for r in later]


def test_dead_letter_then_carry_on(
    settings: Settings, codec: Any, topic: str, group_id: str
) -> None:
    good = make_records(jobs=1, per_job=6)
    garbage = b"\x00not an avro single-object message"
    producer = RecordProducer(settings, codec)
    for record in good[:3]:
        producer.send(record, topic)
    producer.send_bytes(topic, good[0].job_id, garbage)
    for record in good[3:]:
        producer.send(record, topic)
    producer.flush(10)

    with RecordConsumer(settings, codec, [topic], group_id) as consumer:
        got = drain(consumer, len(good))
        assert [c.record.id for c in got] == [r.id for r in good]
        assert consumer.dead_letters == 1
        consumer.commit()

    with DeadLetterReader(settings, topic) as reader:
        letters = reader.read(1)
    assert len(letters) == 1
    letter = letters[0]
    assert letter.topic == topic
    assert letter.value == garbage
    assert letter.key == good[0].job_id.encode()
    # It sat between the third and the fourth good record of the same partition.
    assert letter.partition == got[2].partition == got[3].partition
    assert got[2].offset < letter.offset < got[3].offset
    assert letter.error

    # Committed past the dead letter: the group does not see it (or anything) again.
    with RecordConsumer(settings, codec, [topic], group_id) as again:
        assert drain(again, 1, timeout_s=2.0) == []
        assert again.dead_letters == 0


def test_archive_while_consuming(
    settings: Settings, codec: Any, topic: str, group_id: str, tmp_path: Path
) -> None:
    records = make_records(jobs=1, per_job=300)
    publish(settings, codec, topic, records)
    path = tmp_path / "job-0.avro"
    writer = ArchiveWriter(path, flush_every=25)
    seen_while_writing: list[list[Any]] = []
    done = threading.Event()

    def read_repeatedly() -> None:
        while not done.is_set():
            seen_while_writing.append([e.record for e in ArchiveReader(path)])

    reader = threading.Thread(target=read_repeatedly)
    reader.start()
    try:
        with RecordConsumer(settings, codec, [topic], group_id) as consumer:
            got = drain(consumer, len(records))
        half = len(got) // 2
        for c in got[:half]:
            writer.append(c.topic, Direction.RECEIVED, c.record, c.timestamp)
        writer.flush()
        # The writer is still open: a reader sees everything flushed so far.
        assert [e.record for e in ArchiveReader(path)] == [c.record for c in got[:half]]
        for c in got[half:]:
            writer.append(c.topic, Direction.RECEIVED, c.record, c.timestamp)
        writer.close()
    finally:
        done.set()
        reader.join()

    archived = list(ArchiveReader(path))
    assert [env.record for env in archived] == records
    assert all(env.topic == topic and env.direction is Direction.RECEIVED for env in archived)
    full = [c.record for c in got]
    # Every read during writing saw a prefix, in order: never a torn or reordered record.
    assert seen_while_writing
    assert all(seen == full[: len(seen)] for seen in seen_while_writing)


def test_flush_reports_undeliverable_records() -> None:
    # Nothing listens on port 1: the record times out and flush() must say so.
    producer = RecordProducer(
        Settings({"bootstrap.servers": "127.0.0.1:1"}),
        config={"message.timeout.ms": 300, "log_level": 0},
    )
    producer.send_bytes("nowhere", b"job-x", b"payload")
    with pytest.raises(DeliveryError, match="not delivered"):
        producer.flush(10)
