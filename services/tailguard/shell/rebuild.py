"""Rebuilding a service's state after a restart.

The cores keep their state in memory. On start, before the live stream resumes from the group's
committed offsets, the service folds its last snapshot (tailguard.shell.snapshot), then reads its
input topic from the snapshot's positions (from the beginning without one) up to those offsets and
feeds the core with the outputs suppressed: what it emitted for those records was published by
its previous incarnation. Records after the committed offsets are processed live again, so a
decision whose input was not committed is re-emitted — with the same id, which the agent ignores.

With several instances in the group (scale-out), a partition can also change hands while both
run: the instance given it catches up first (`catch_up`), from where its own state on that
partition stops to the first record the stream hands over, whatever the other instance did
meanwhile.

These reads are librdkafka's, in a process whose stream is faust's aiokafka (one Kafka client per
service process is the rule, issue 26), for speed: a restart is ready after the longer of the
rebuild and the stream's start (worker.StateLoad), and make bench-restart's target is 10 s
(8.19 s median, 7.3 s of it the stream's start; without a snapshot, 268,000 records rebuilt in
6.85 s beside a 7.45 s stream start). aiokafka reads a topic to its end up to 3.4 times slower
(benchmarks/rebuild_client_read.py, the read alone, two rounds each: 270,000 records from the
mock broker in 2.97 and 3.90 s by librdkafka, 4.99 and 7.18 s by aiokafka, load 4-8; 1,000,000
from Apache Kafka in 24.9 and 9.3 s, 26.3 and 31.4 s, load 15-18), which would make the rebuild
the longer of the two and ready later than 10 s. The snapshot check (`snapshot_mismatch`) reads
the same topic just before the rebuild, in the same thread, while the app's own client is still
connecting; a catch-up reads as the rebuild does, while the stream waits on it; the worker's
carry-over after a lost broker runs once faust's app, and its client, have stopped. Each reader
is closed when its read is done: a ready service holds no librdkafka client
(tests/integration/test_service_kafka_clients.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from confluent_kafka import Consumer, TopicPartition

from tailguard.kafka.consumer import message_headers
from tailguard.kafka.signing import ReceivedHeaders
from tailguard.kafka.topic_scan import read_only_consumer, read_to_end, watermarks
from tailguard.shell.snapshot import Position, digest


def committed_offsets(consumer: Consumer, group_topic: str, timeout: float) -> dict[int, int]:
    """partition -> next offset to read, for partitions the group has committed."""
    metadata = consumer.list_topics(group_topic, timeout=timeout)
    topic = metadata.topics.get(group_topic)
    if topic is None or topic.error is not None:
        return {}
    partitions = [TopicPartition(group_topic, p) for p in sorted(topic.partitions)]
    committed = consumer.committed(partitions, timeout=timeout)
    return {tp.partition: tp.offset for tp in committed if tp.offset >= 0}


@dataclass(frozen=True)
class Rebuilt:
    fed: int  # records read from the topic and fed to the core
    committed: dict[int, int]  # partition -> the group's committed offset, where it has one


def rebuild(
    settings: Mapping[str, str],
    group_id: str,
    topic: str,
    feed: Callable[[bytes | None, int, int, ReceivedHeaders], None],
    start_at: Mapping[int, int] | None = None,
    timeout: float = 10.0,
    progress: Callable[[int], None] | None = None,
) -> Rebuilt:
    """Feed `feed(value, partition, offset, headers)` every record from `start_at` (a snapshot's
    positions; the beginning by default) up to the group's committed offsets."""
    consumer = read_only_consumer(settings, group_id)
    try:
        ends = committed_offsets(consumer, topic, timeout)
        fed = _feed_range(consumer, topic, start_at, ends, feed, timeout, progress) if ends else 0
        return Rebuilt(fed, ends)
    finally:
        consumer.close()


def catch_up(
    settings: Mapping[str, str],
    group_id: str,
    topic: str,
    partition: int,
    start: int,
    end: int,
    feed: Callable[[bytes | None, int, int, ReceivedHeaders], None],
    timeout: float = 10.0,
) -> int:
    """Feed `feed` the records of one partition from `start` up to `end` (the first record the
    live stream hands over): what another instance of the service in the same group processed
    while it owned the partition, so that its jobs' state is whole before this instance decides
    for them (the outputs were published by that instance). Returns how many were fed."""
    consumer = read_only_consumer(settings, group_id)
    try:
        return _feed_range(consumer, topic, {partition: start}, {partition: end}, feed, timeout)
    finally:
        consumer.close()


def _feed_range(
    consumer: Consumer,
    topic: str,
    starts: Mapping[int, int] | None,
    ends: Mapping[int, int],
    feed: Callable[[bytes | None, int, int, ReceivedHeaders], None],
    timeout: float,
    progress: Callable[[int], None] | None = None,
) -> int:
    fed = 0
    for msg in read_to_end(consumer, topic, starts=starts, ends=ends, stall_s=timeout):
        feed(msg.value(), msg.partition() or 0, msg.offset() or 0, message_headers(msg.headers()))
        fed += 1
        if progress is not None and fed % 10_000 == 0:
            progress(fed)
    return fed


def snapshot_mismatch(
    settings: Mapping[str, str],
    group_id: str,
    topic: str,
    positions: Mapping[int, Position],
    timeout: float = 10.0,
) -> str | None:
    """Why a snapshot's positions are not on this topic's log, or None if they are: the record
    before each position must still be the one the snapshot read last (an embedded broker
    restarts empty and numbers its log from 0 again; real Kafka never renumbers). A record
    already deleted by retention cannot be checked and is taken as matching."""
    consumer = read_only_consumer(settings, group_id)
    try:
        last_read: dict[int, int] = {}  # partition -> the offset the snapshot read last
        marks = watermarks(consumer, topic, timeout)
        for partition, position in positions.items():
            if position.next_offset <= 0:
                continue
            low, high = marks.get(partition, (0, 0))
            if high < position.next_offset:
                return (
                    f"{topic}[{partition}] ends at offset {high}, the snapshot read up to "
                    f"{position.next_offset}: another log"
                )
            if low < position.next_offset:
                last_read[partition] = position.next_offset - 1
        found = {
            msg.partition() or 0: digest(msg.value())
            for msg in read_to_end(
                consumer,
                topic,
                starts=last_read,
                ends={p: at + 1 for p, at in last_read.items()},
                stall_s=timeout,
            )
        }
        for partition, seen in sorted(found.items()):
            if seen != positions[partition].last_digest:
                offset = positions[partition].next_offset - 1
                return f"{topic}[{partition}]@{offset} is not the record the snapshot read there"
        return None
    finally:
        consumer.close()
