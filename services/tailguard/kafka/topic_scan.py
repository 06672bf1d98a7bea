"""Reading a topic once, from its start (or given offsets) up to ends fixed before the read.

What a replay, a service's rebuild and the fleet list's readers need: not a live stream
(`tailguard.kafka.topic_reader.TopicReader` is that) but "everything there is now", read by a
consumer that is assigned its partitions, never subscribes and never commits, so reading moves
nobody's offsets and joins no group.

The ends are read before the first fetch (the high watermarks, or offsets the caller gives,
such as a group's committed offsets), so records published meanwhile do not make the read
longer, and a read that stops getting records raises `TopicReadStalled` naming the topic and
what was left, instead of waiting for ever. A start below what the broker still holds (Kafka
deletes by retention; the mock broker keeps only the newest ~5 MiB of each partition) reads
from the oldest record it has: a range entirely gone is read as empty.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

from tailguard.kafka.config import client_config

_READ_ONLY: Mapping[str, Any] = {
    "enable.auto.commit": False,
    # Where a start is no longer on the broker: its oldest record.
    "auto.offset.reset": "earliest",
    # Looking a missing topic up must not create it with broker defaults.
    "allow.auto.create.topics": False,
    "log_level": 3,
}

DEFAULT_STALL_S = 10.0


class TopicReadStalled(TimeoutError):
    """No record came for as long as the reader waits, with some of the range still unread."""


def read_only_config(
    settings: Mapping[str, str], group_id: str, config: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The librdkafka config of a consumer for `read_to_end`, with the `kafka.*` settings of
    every tailguard client (the same brokers and credentials as a service's faust app).
    `group_id` names the reader (it is never joined); a caller may read that group's committed
    offsets with it (a service's state rebuild does)."""
    return client_config(
        settings, "consumer", {**_READ_ONLY, "group.id": group_id, **(config or {})}
    )


def read_only_consumer(
    settings: Mapping[str, str], group_id: str, config: Mapping[str, Any] | None = None
) -> Consumer:
    """A consumer with `read_only_config`."""
    return Consumer(read_only_config(settings, group_id, config))


def watermarks(consumer: Consumer, topic: str, timeout_s: float) -> dict[int, tuple[int, int]]:
    """partition -> (oldest offset held, next offset to be written); empty when the topic does
    not exist (the mock broker creates a topic at its first record)."""
    meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
    if meta is None or meta.error is not None:
        return {}
    return {
        p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)
        for p in sorted(meta.partitions)
    }


def read_to_end(
    consumer: Consumer,
    topic: str,
    *,
    starts: Mapping[int, int] | None = None,
    ends: Mapping[int, int] | None = None,
    stall_s: float = DEFAULT_STALL_S,
) -> Iterator[Message]:
    """The messages of `topic` from `starts` (default: the oldest held) up to, not including,
    `ends` (default: every partition's end now; given, only those partitions are read, and an
    end past the partition's end now is read to that end), in order within each partition.
    `TopicReadStalled` when no message came for `stall_s` seconds with some left to read;
    `KafkaException` for an error the broker answered. The consumer stays the caller's."""
    held = watermarks(consumer, topic, stall_s)
    wanted = held if ends is None else {p: held[p] for p in ends if p in held}
    ranges: dict[int, tuple[int, int]] = {}
    for partition, (low, high) in wanted.items():
        start = max(low, (starts or {}).get(partition, low))
        end = high if ends is None else min(high, ends[partition])
        if start < end:
            ranges[partition] = (start, end)
    if not ranges:
        return
    consumer.assign([TopicPartition(topic, p, start) for p, (start, _) in sorted(ranges.items())])
    remaining = {p: end for p, (_, end) in ranges.items()}
    while remaining:
        msg = consumer.poll(stall_s)
        if msg is None:
            left = ", ".join(f"[{p}] up to {at}" for p, at in sorted(remaining.items()))
            raise TopicReadStalled(
                f"reading {topic}: no record for {stall_s:g} s with {left} still to read"
            )
        if msg.error():
            raise KafkaException(msg.error())
        partition, offset = msg.partition() or 0, msg.offset() or 0
        stop = remaining.get(partition)
        if stop is None or offset >= stop:
            continue  # fetched along with the range's last records
        yield msg
        if offset + 1 >= stop:
            del remaining[partition]
            consumer.pause([TopicPartition(topic, partition)])
    # librdkafka keeps a partition's pause across assignments: a later read by the same
    # consumer would wait on it for ever.
    consumer.resume([TopicPartition(topic, p) for p in ranges])
    consumer.unassign()
