"""Reading whole topics with self-managed partition assignment and group-committed offsets.

Each tailguard reader is the only reader of its topic (a service's output must be a pure
function of that topic's order), so there is nothing to balance between group members. The
reader therefore assigns itself every partition of its topics and uses its group id only to
commit and fetch offsets. That also sidesteps two behaviours of librdkafka's mock cluster: a
3 s delay before the first rebalance of a group, and a stalled rebalance when a subscription's
topic appears after the consumer joined (seen with librdkafka 2.16).

Topics need not exist yet (the embedded broker creates a topic on its first produce): a missing
topic is looked up again every `discovery_interval_s` while polling, and assigned from its
committed offsets (or the beginning/end) as soon as it appears.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from tailguard.log.kafka_config import client_config

log = logging.getLogger(__name__)

READER_DEFAULTS: Mapping[str, Any] = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    # Do not let a lookup of a missing topic create it with broker defaults.
    "allow.auto.create.topics": False,
    "fetch.wait.max.ms": 5,
    "log_level": 3,
}

# Errors seen in normal operation: the end of a partition; a topic that does not exist yet.
IGNORABLE_ERRORS = (KafkaError._PARTITION_EOF, KafkaError.UNKNOWN_TOPIC_OR_PART)

_METADATA_TIMEOUT_S = 5.0


class TopicReader:
    """Raw messages of `topics`, every partition, resuming from `group_id`'s committed offsets."""

    def __init__(
        self,
        settings: Mapping[str, str],
        topics: Iterable[str],
        group_id: str,
        *,
        from_beginning: bool = True,
        config: Mapping[str, Any] | None = None,
        discovery_interval_s: float = 0.1,
    ) -> None:
        self.topics = list(dict.fromkeys(topics))
        self.group_id = group_id
        self.from_beginning = from_beginning
        self.discovery_interval_s = discovery_interval_s
        defaults = {
            **READER_DEFAULTS,
            "group.id": group_id,
            # Also where to go when the committed offset is no longer on the broker (the
            # embedded broker keeps only the newest ~5 MB of each partition).
            "auto.offset.reset": "earliest" if from_beginning else "latest",
        }
        self.consumer = Consumer(
            {**client_config(settings, "consumer", defaults), **(config or {})}
        )
        self._missing = set(self.topics)
        self._next_discovery = 0.0
        # Next offset to commit per (topic, partition): one past the last message handed out.
        self._positions: dict[tuple[str, int], int] = {}
        # Committed offsets not yet reached: the first message of such a partition tells
        # whether the broker still had everything after the commit.
        self._resume_at: dict[tuple[str, int], int] = {}

    @property
    def waiting_for(self) -> set[str]:
        """Topics that do not exist (yet)."""
        return set(self._missing)

    def _discover(self) -> None:
        now = time.monotonic()
        if not self._missing or now < self._next_discovery:
            return
        self._next_discovery = now + self.discovery_interval_s
        for topic in sorted(self._missing):
            meta = self.consumer.list_topics(topic, timeout=_METADATA_TIMEOUT_S).topics.get(topic)
            if meta is None or meta.error is not None or not meta.partitions:
                continue
            wanted = [TopicPartition(topic, p) for p in sorted(meta.partitions)]
            committed = self.consumer.committed(wanted, timeout=_METADATA_TIMEOUT_S)
            default = OFFSET_BEGINNING if self.from_beginning else OFFSET_END
            start = [
                TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else default)
                for tp in committed
            ]
            self.consumer.incremental_assign(start)
            for tp in committed:
                if tp.offset >= 0:
                    self._resume_at[(tp.topic, tp.partition)] = tp.offset
            self._missing.discard(topic)

    def poll(self, timeout: float, max_messages: int = 1000) -> list[Message]:
        """The messages that arrive within `timeout` seconds, errors filtered out."""
        deadline = time.monotonic() + timeout
        while True:
            self._discover()
            # Whatever is queued already, without waiting; else wait for the first message
            # only (consume(n, t) would wait for n messages or t: latency) and take the rest
            # that came with it.
            batch = self.consumer.consume(max_messages, 0)
            if not batch:
                remaining = max(0.0, deadline - time.monotonic())
                # While a topic is missing, wait in short slices so it is picked up promptly.
                wait = min(remaining, self.discovery_interval_s) if self._missing else remaining
                first = self.consumer.poll(wait)
                if first is not None:
                    batch = [first]
                    if max_messages > 1:
                        batch.extend(self.consumer.consume(max_messages - 1, 0))
            messages = [m for m in batch if _usable(m)]
            if messages or time.monotonic() >= deadline:
                break
        for msg in messages:
            where, offset = (str(msg.topic()), msg.partition() or 0), msg.offset() or 0
            if self._resume_at and where in self._resume_at:
                self._check_gap(where, self._resume_at.pop(where), offset)
            self._positions[where] = offset + 1
        return messages

    def _check_gap(self, where: tuple[str, int], committed: int, first: int) -> None:
        if first > committed:
            log.warning(
                "%s[%d]: records %d..%d were gone from the broker when %s resumed "
                "(the embedded broker keeps only the newest ~5 MB per partition)",
                *where, committed, first - 1, self.group_id,
            )  # fmt: skip

    def commit(self) -> None:
        """Commit (synchronously) the offsets of everything handed out so far."""
        if not self._positions:
            return
        offsets = [TopicPartition(t, p, o) for (t, p), o in self._positions.items()]
        self.consumer.commit(offsets=offsets, asynchronous=False)
        self._positions.clear()

    def close(self) -> None:
        self.consumer.close()


def _usable(msg: Message) -> bool:
    err = msg.error()
    if err is None:
        return True
    if err.code() in IGNORABLE_ERRORS:
        return False
    if err.fatal():
        raise KafkaException(err)
    # Transient (broker unreachable and the like): librdkafka retries by itself.
    return False
