"""Dead letters: records that could not be decoded, kept with where they came from.

A dead letter is published to `<topic>.dlq` with the original key and the original bytes as its
value, and these headers (UTF-8 values):

    tailguard.topic      the topic it was read from
    tailguard.partition  its partition there (decimal)
    tailguard.offset     its offset there (decimal)
    tailguard.error      why it could not be decoded
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Message

from tailguard.kafka.producer import Headers
from tailguard.kafka.topic_reader import TopicReader

DLQ_SUFFIX = ".dlq"
HEADER_TOPIC = "tailguard.topic"
HEADER_PARTITION = "tailguard.partition"
HEADER_OFFSET = "tailguard.offset"
HEADER_ERROR = "tailguard.error"


def dlq_topic(topic: str) -> str:
    return topic + DLQ_SUFFIX


def dead_letter(
    topic: str, partition: int, offset: int, key: bytes | None, value: bytes, error: str
) -> tuple[str, bytes | None, bytes, Headers]:
    """The dead letter of a record read at `topic[partition]@offset`, as `send_bytes` takes
    it: its topic, the record's own key (so it stays with its job's partition and a reader can
    tell whose it was), the record's bytes and the headers."""
    return dlq_topic(topic), key, value, dead_letter_headers(topic, partition, offset, error)


def dead_letter_headers(topic: str, partition: int, offset: int, error: str) -> Headers:
    return [
        (HEADER_TOPIC, topic.encode()),
        (HEADER_PARTITION, str(partition).encode()),
        (HEADER_OFFSET, str(offset).encode()),
        (HEADER_ERROR, error.encode()),
    ]


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One entry of a dead-letter topic."""

    topic: str
    partition: int
    offset: int
    error: str
    key: bytes | None
    value: bytes
    # Where the dead letter itself sits.
    dlq_partition: int
    dlq_offset: int

    @classmethod
    def from_message(cls, msg: Message) -> DeadLetter:
        headers: dict[str, bytes] = {}
        raw_headers = msg.headers() or []
        for name, value in raw_headers if isinstance(raw_headers, list) else []:
            headers[name] = value.encode() if isinstance(value, str) else (value or b"")
        try:
            return cls(
                topic=headers[HEADER_TOPIC].decode(),
                partition=int(headers[HEADER_PARTITION]),
                offset=int(headers[HEADER_OFFSET]),
                error=headers[HEADER_ERROR].decode(errors="replace"),
                key=msg.key(),
                value=msg.value() or b"",
                dlq_partition=int(msg.partition() or 0),
                dlq_offset=int(msg.offset() or 0),
            )
        except (KeyError, ValueError) as err:
            raise ValueError(
                f"{msg.topic()}[{msg.partition()}]@{msg.offset()} is not a tailguard dead letter "
                f"(missing or bad header: {err})"
            ) from None


class DeadLetterReader:
    """Reads the dead letters of `topic` from the beginning, under a fresh group id of its own
    that it never commits (reading dead letters must not move anyone's offsets)."""

    def __init__(
        self,
        settings: Mapping[str, str],
        topic: str,
        *,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self.topic = dlq_topic(topic)
        self._reader = TopicReader(
            settings, [self.topic], f"tailguard-dlq-reader-{uuid.uuid4().hex}", config=config
        )

    def poll(self, timeout: float = 1.0, max_records: int = 500) -> list[DeadLetter]:
        return [DeadLetter.from_message(m) for m in self._reader.poll(timeout, max_records)]

    def read(self, expected: int, timeout: float = 10.0) -> list[DeadLetter]:
        """Poll until `expected` dead letters have arrived or `timeout` seconds have passed."""
        deadline = time.monotonic() + timeout
        letters: list[DeadLetter] = []
        while len(letters) < expected and time.monotonic() < deadline:
            letters.extend(self.poll(min(0.5, max(0.0, deadline - time.monotonic()))))
        return letters

    def close(self) -> None:
        self._reader.close()

    def __enter__(self) -> DeadLetterReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
