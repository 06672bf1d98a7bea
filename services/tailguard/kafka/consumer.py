"""Consuming records: decode, divert undecodable bytes to `<topic>.dlq`, commit what was read.

Offsets are committed explicitly (`commit()`), never automatically, so a consumer that restarts
with the same group id resumes right after the last record its owner finished with. How
partitions are assigned (self-managed, group used for offsets) is explained in `topic_reader`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Message

from tailguard.kafka.codec_api import Codec
from tailguard.kafka.dead_letters import dead_letter
from tailguard.kafka.producer import RecordProducer
from tailguard.kafka.topic_reader import TopicReader
from tailguard.model.records import Record

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Consumed:
    """A decoded record and where it was read."""

    record: Record
    topic: str
    partition: int
    offset: int
    # Broker or producer timestamp, ms since the epoch.
    timestamp: int
    raw: bytes
    # The message's headers in the order they were sent (a signature, see `kafka/signing.py`).
    headers: tuple[tuple[str, bytes], ...] = ()


_Value = str | bytes | None


def message_headers(
    headers: Mapping[str, _Value] | Sequence[tuple[str, _Value]] | None,
) -> tuple[tuple[str, bytes], ...]:
    """A message's headers as (name, bytes) pairs, in order (librdkafka gives a list; its
    typing also allows a dict)."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers or ()
    return tuple(
        (name, value.encode() if isinstance(value, str) else value or b"") for name, value in pairs
    )


class RecordConsumer:
    """Reads the records of `topics`, committing offsets under `group_id`.

    A message whose bytes fail to decode goes to `<topic>.dlq` (original key and bytes, headers
    with its topic/partition/offset and the error) and is skipped: one bad record never stops
    the consumer. Its offset counts as read, so it is committed like the others.

    With `keys`, only messages with one of those keys (or none: a message nobody else claims)
    are decoded; the others are skipped unread. A job's agent reads only its own job's records
    this way, and never files another job's undecodable record as a dead letter (every agent
    would file it again). `start_at_ms`: see `TopicReader`.
    """

    def __init__(
        self,
        settings: Mapping[str, str],
        codec: Codec,
        topics: Iterable[str],
        group_id: str,
        *,
        from_beginning: bool = True,
        start_at_ms: int | None = None,
        keys: Iterable[bytes] | None = None,
        config: Mapping[str, Any] | None = None,
        max_batch: int = 1000,
    ) -> None:
        self.codec = codec
        self.group_id = group_id
        self.max_batch = max_batch
        self.keys = frozenset(keys) if keys is not None else None
        self._reader = TopicReader(
            settings,
            topics,
            group_id,
            from_beginning=from_beginning,
            start_at_ms=start_at_ms,
            config=config,
        )
        self._settings = settings
        self._dlq: RecordProducer | None = None
        self.dead_letters = 0

    @property
    def topics(self) -> list[str]:
        return self._reader.topics

    def poll(self, timeout: float = 1.0) -> list[Consumed]:
        """The records that arrive within `timeout` seconds (possibly none)."""
        out: list[Consumed] = []
        for msg in self._reader.poll(timeout, self.max_batch):
            if self.keys is not None and (key := msg.key()) is not None and key not in self.keys:
                continue
            consumed = self._decode(msg)
            if consumed is not None:
                out.append(consumed)
        return out

    def _decode(self, msg: Message) -> Consumed | None:
        raw = msg.value() or b""
        topic, partition, offset = str(msg.topic()), msg.partition() or 0, msg.offset() or 0
        try:
            record = self.codec.decode(raw)
        # Any failure to decode, not only the codec's DecodeError: a codec bug on foreign bytes
        # must not stop the consumer either; the dead letter carries the error for inspection.
        except Exception as err:
            error = f"{type(err).__name__}: {err}"
            log.warning("dead letter %s[%d]@%d: %s", topic, partition, offset, error)
            if self._dlq is None:
                self._dlq = RecordProducer(self._settings)
            self._dlq.send_bytes(*dead_letter(topic, partition, offset, msg.key(), raw, error))
            self.dead_letters += 1
            return None
        _, timestamp = msg.timestamp()
        return Consumed(
            record, topic, partition, offset, int(timestamp), raw, message_headers(msg.headers())
        )

    def commit(self) -> None:
        """Commit the offsets of everything `poll` has read so far (synchronously). Dead letters
        are flushed first, so an offset is never committed past a record that went nowhere."""
        if self._dlq is not None:
            self._dlq.flush()
        self._reader.commit()

    def close(self) -> None:
        """Stop reading (without committing: call `commit()` first to keep your place)."""
        try:
            if self._dlq is not None:
                self._dlq.flush()
        finally:
            self._reader.close()

    def __enter__(self) -> RecordConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
