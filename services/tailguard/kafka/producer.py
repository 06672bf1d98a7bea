"""Publishing records: one producer, keyed by job id so each job's records stay in order."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from tailguard.kafka.codec_api import Codec
from tailguard.kafka.config import client_config
from tailguard.model.records import Record

# Throughput: batch for up to 2 ms and send large batches, without giving up per-key order.
# Idempotence keeps order within a partition even with several requests in flight (and
# retries); librdkafka's mock cluster supports it (checked by the contract tests).
PRODUCER_DEFAULTS: Mapping[str, Any] = {
    # A key's partition as Kafka's Java client and aiokafka (the services' faust apps) compute
    # it: murmur2. librdkafka's default (CRC32) sends the same key elsewhere, and a topic two
    # kinds of client write by key then splits one key's records over two partitions: an
    # operator's `tailguard blocklist remove HOST` landed beside the blocklist service's entry
    # for HOST, not after it, so compaction kept both and a reader folding the partitions could
    # see the host still listed (the bench-attach run of 2026-11-29 did).
    "partitioner": "murmur2_random",
    "enable.idempotence": True,
    "linger.ms": 2,
    "batch.num.messages": 10_000,
    "batch.size": 1_000_000,
    "queue.buffering.max.messages": 1_000_000,
    "queue.buffering.max.kbytes": 1_048_576,
    # Only failures need a callback (to be raised from flush); skipping the per-record callback
    # for successes saves a Python call per record.
    "delivery.report.only.error": True,
    "log_level": 4,
}

# Message headers as librdkafka takes them.
Headers = list[tuple[str, str | bytes | None]]

# Delivery reports are served every this many records (and by flush).
_POLL_EVERY = 1000

# How many failed deliveries a DeliveryError describes in its message.
_SHOWN_ERRORS = 5


def producer_config(
    settings: Mapping[str, str], config: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The librdkafka config of a `RecordProducer`: the `kafka.*` settings (security included)
    over `PRODUCER_DEFAULTS`, and the caller's `config` over both."""
    return {**client_config(settings, "producer", PRODUCER_DEFAULTS), **(config or {})}


class DeliveryError(RuntimeError):
    """Some records were not delivered."""

    def __init__(self, errors: Sequence[tuple[str, bytes | None, KafkaError]], pending: int = 0):
        self.errors = list(errors)
        self.pending = pending
        parts = [f"{len(self.errors)} record(s) not delivered"]
        if pending:
            parts.append(f"{pending} still pending after the flush timeout")
        shown = "; ".join(
            f"{topic} key={key!r}: {err.str()}" for topic, key, err in self.errors[:_SHOWN_ERRORS]
        )
        super().__init__(", ".join(parts) + (f" ({shown})" if shown else ""))


class QueueFull(BufferError):
    """The producer's local queue stayed full for as long as the caller would wait."""


class RecordProducer:
    """Encodes and publishes records; `flush()` raises if any delivery failed."""

    def __init__(
        self,
        settings: Mapping[str, str],
        codec: Codec | None = None,
        *,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self.codec = codec
        self._producer = Producer(producer_config(settings, config))
        self._errors: list[tuple[str, bytes | None, KafkaError]] = []
        self._unpolled = 0

    def send(self, record: Record, topic: str | None = None) -> None:
        """Publish `record` to `topic` (default: its class's topic), keyed by its job id."""
        if self.codec is None:
            raise TypeError("this producer has no codec; use send_bytes")
        target = topic or type(record).TOPIC
        if not target:
            raise ValueError(f"{type(record).__name__} has no topic; pass one")
        self.send_bytes(target, record.job_id.encode(), self.codec.encode(record))

    def send_bytes(
        self,
        topic: str,
        key: bytes | str | None,
        value: bytes | None,
        headers: Headers | None = None,
        *,
        wait_s: float | None = None,
    ) -> None:
        """Publish already-encoded bytes (dead letters, replays of an archive; None: a
        tombstone on a compacted topic). While the local
        queue is full, wait for room: for ever, or `wait_s` seconds and then raise `QueueFull`
        (the record is not sent)."""
        deadline = None if wait_s is None else time.monotonic() + wait_s
        while True:
            try:
                self._producer.produce(
                    topic, value=value, key=key, headers=headers, on_delivery=self._delivered
                )
                break
            except BufferError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise QueueFull(
                        f"the producer's queue ({len(self._producer)} records) stayed full for "
                        f"{wait_s:g} s: no broker takes them"
                    ) from None
                # The local queue is full: let librdkafka drain it, then retry this record.
                self._producer.poll(0.05)
        self._unpolled += 1
        if self._unpolled >= _POLL_EVERY:
            # Serve delivery reports now and then, not per record (a call into librdkafka).
            self._producer.poll(0)
            self._unpolled = 0

    def _delivered(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self._errors.append((str(msg.topic()), msg.key(), err))

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until everything sent is delivered; raise `DeliveryError` if anything failed
        (the failures are reported once) or is still pending after `timeout` seconds."""
        pending = self._producer.flush(timeout)
        if self._errors or pending:
            errors, self._errors = self._errors, []
            raise DeliveryError(errors, pending)

    def purge(self) -> int:
        """Drop what is still queued (it will not be delivered); how many records that was."""
        dropped = len(self._producer)
        self._producer.purge()
        self._producer.poll(0)  # serve the purged records' reports: nothing waits on them
        self._errors.clear()
        return dropped

    def __len__(self) -> int:
        """Records sent but not yet delivered."""
        return len(self._producer)

    def close(self, timeout: float = 30.0) -> None:
        self.flush(timeout)

    def __enter__(self) -> RecordProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
