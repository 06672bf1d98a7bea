"""Rebuilding a service's state after a restart.

The cores keep their state in memory. On start, before the live stream resumes from the group's
committed offsets, the service reads its input topic from the beginning up to those offsets and
feeds the core with the outputs suppressed: what it emitted for those records was published by
its previous incarnation. Records after the committed offsets are processed live again, so a
decision whose input was not committed is re-emitted — with the same id, which the agent ignores.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from tailguard.log.kafka_config import client_config

# Read-only: never commit on the service group's behalf.
_REBUILD_CONSUMER = {"enable.auto.commit": False, "auto.offset.reset": "earliest"}


def rebuild_config(settings: Mapping[str, str], group_id: str) -> dict[str, Any]:
    """The librdkafka config of the rebuild's consumer: the service's own `kafka.*` settings
    (the same brokers and credentials as its faust app), reading as `group_id`."""
    return client_config(settings, "consumer", {**_REBUILD_CONSUMER, "group.id": group_id})


def committed_offsets(consumer: Consumer, group_topic: str, timeout: float) -> dict[int, int]:
    """partition -> next offset to read, for partitions the group has committed."""
    metadata = consumer.list_topics(group_topic, timeout=timeout)
    topic = metadata.topics.get(group_topic)
    if topic is None or topic.error is not None:
        return {}
    partitions = [TopicPartition(group_topic, p) for p in sorted(topic.partitions)]
    committed = consumer.committed(partitions, timeout=timeout)
    return {tp.partition: tp.offset for tp in committed if tp.offset >= 0}


def rebuild(
    settings: Mapping[str, str],
    group_id: str,
    topic: str,
    feed: Callable[[bytes | None], None],
    timeout: float = 10.0,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Feed every record below the group's committed offsets to `feed`; returns the count."""
    consumer = Consumer(rebuild_config(settings, group_id))
    fed = 0
    try:
        ends = committed_offsets(consumer, topic, timeout)
        if not ends:
            return 0
        consumer.assign([TopicPartition(topic, p, 0) for p in sorted(ends)])
        remaining = {p: end for p, end in ends.items() if end > 0}
        for p in set(ends) - set(remaining):
            consumer.pause([TopicPartition(topic, p)])
        while remaining:
            msg = consumer.poll(timeout)
            if msg is None:
                raise TimeoutError(
                    f"rebuild of {group_id} from {topic} stalled with {remaining} left to read"
                )
            if msg.error():
                raise KafkaException(msg.error())
            partition, offset = msg.partition(), msg.offset()
            end = remaining.get(partition)
            if end is None or offset >= end:
                continue
            feed(msg.value())
            fed += 1
            if progress is not None and fed % 10_000 == 0:
                progress(fed)
            if offset + 1 >= end:
                del remaining[partition]
                consumer.pause([TopicPartition(topic, partition)])
        return fed
    finally:
        consumer.close()
