"""Where the agent's facts go, and how the services' decisions come back.

Every event the agent publishes and every finding and command it receives is also appended to
the job's Avro archive, the durable audit log that `tailguard replay` reads (the embedded broker
keeps nothing once stopped). Decisions the agent made itself as fallbacks are archived with
direction `local`, so a replay can tell them from the services' own.

With a signing key configured (`security.command-signing.key`), each command's signature is
checked on arrival, and what was found travels with the command to the driver, which rejects
what did not come from the right service. A command whose signature does not check out is
archived under `UNAUTHENTICATED_COMMANDS_TOPIC`: kept for the audit, but apart from the services'
decisions that a replay compares. The agent signs its own fallback decisions as `agent`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from tailguard.agent.driver.ports import CommandReceived
from tailguard.codec import RecordCodec
from tailguard.log.archive import ArchiveWriter
from tailguard.log.consumer import Consumed, RecordConsumer
from tailguard.log.producer import DeliveryError, Headers, QueueFull
from tailguard.log.signing import NoVerification, signer_for, verifier_for
from tailguard.model import records as r
from tailguard.model.authority import AGENT, received_archive_topic
from tailguard.model.config import Settings, parse_duration_ms

log = logging.getLogger(__name__)


class ArchivePublisher:
    """Facts to the archive only: a run with no broker (services off, nothing to tell)."""

    def __init__(self, archive: ArchiveWriter, codec: RecordCodec) -> None:
        # The archive's location (a path or a URI), for the job's result.
        self.archive_path = archive.location
        self.codec = codec
        self._archive = archive
        self._lock = threading.Lock()

    def _append(self, record: r.Record, direction: str, topic: str | None = None) -> None:
        with self._lock:
            self._archive.append(topic or type(record).TOPIC, direction, record, record.ts)

    def publish(self, record: r.Record) -> None:
        self._append(record, "published")

    def received(self, record: r.Record) -> None:
        self._append(record, "received")

    def local(self, record: r.Record) -> None:
        self._append(record, "local")

    def close(self) -> None:
        with self._lock:
            self._archive.close()


# The agent's producer waits for a broker as long as it takes (no message timeout): its queue
# is the ordered backlog of what a lost broker missed, sent when one is back, in order and once
# (idempotence). An archive-fed backlog would re-send what librdkafka already holds in order.
# Reconnecting within 1 s of a restart, not librdkafka's 10 s backoff: decisions wait for it.
AGENT_PRODUCER_CONFIG: Mapping[str, Any] = {
    "message.timeout.ms": 0,
    "reconnect.backoff.max.ms": 1000,
}
# How long `publish` waits for room in a full producer queue (1M records: the broker has been
# gone a long while) before giving Kafka up for the rest of the job; the archive keeps all.
QUEUE_FULL_WAIT_S = 1.0
# How long the job's end waits for a broker to take what is still queued.
CLOSE_FLUSH_S = 10.0
# How long the job's end waits for the decision reader to stop (each of its broker lookups
# gives up after 5 s while no broker answers).
READER_STOP_S = 15.0


START_MARGIN = "tailguard.agent.start-margin"
DEFAULT_START_MARGIN = "60 s"


def start_margin_ms(settings: Settings) -> int:
    """How far before a job's (or an observed application's) first fact its decision reader
    starts: the most the services' hosts' clocks may lag the driver's (docs/log.md)."""
    return parse_duration_ms(settings.get(START_MARGIN) or DEFAULT_START_MARGIN)


class DecisionReader:
    """What the services send back, read on a thread of its own: each record goes to `take`,
    which archives (or delivers) it and says whether it was about the publisher's jobs;
    `drain` waits until those have gone quiet. Should the thread die, `on_failure` gets the
    exception. The agent's publisher and the observer's share it."""

    def __init__(
        self,
        consumer: RecordConsumer,
        take: Callable[[Consumed], bool],
        *,
        label: str,
        thread_name: str,
        on_failure: Callable[[BaseException], None] | None = None,
        drain_quiet_ms: int = 750,
        drain_max_ms: int = 5000,
    ) -> None:
        self.consumer = consumer
        self._take = take
        self._label = label
        self._on_failure = on_failure
        self._drain_quiet_ms = drain_quiet_ms
        self._drain_max_ms = drain_max_ms
        self._last_seen = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for item in self.consumer.poll(0.1):
                    if self._take(item):
                        self._last_seen = time.monotonic()
        except BaseException as err:  # the job must not go on without its decisions, unseen
            log.exception("%s: the decision reader died", self._label)
            if self._on_failure is not None:
                self._on_failure(err)

    def drain(self) -> None:
        """Wait until nothing about the publisher's jobs came for `drain_quiet_ms` (at most
        `drain_max_ms`), so the decisions about their last events reach the archive."""
        started = time.monotonic()
        while (time.monotonic() - started) * 1000 < self._drain_max_ms:
            quiet_ms = (time.monotonic() - self._last_seen) * 1000
            if quiet_ms >= self._drain_quiet_ms or not self._thread.is_alive():
                break
            self._stop.wait(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=READER_STOP_S)
        if self._thread.is_alive():  # still inside a broker call: closing under it would crash
            log.warning("%s: the decision reader did not stop; left to exit", self._label)
            return
        self.consumer.close()


class KafkaPublisher(ArchivePublisher):
    """Facts to Kafka and the archive; decisions from Kafka to the runner.

    A background thread consumes the findings and commands topics: commands for this job go to
    `deliver` with their signature checked (the driver's inbox, where they are validated and
    applied on the driver's thread); findings are only archived, because the agent acts on
    commands, not on findings — but the findings are the speculator's and blocklist's input,
    which a replay needs.

    Only this job's records are read (by key), from `start_at_ms` on: see docs/log.md#agent.
    Should that thread die, `on_failure` gets the exception (the driver fails the job with it).
    A broker that goes away stops nothing: records queue up and go when it is back (see
    `AGENT_PRODUCER_CONFIG`), and the archive is closed at the end whatever Kafka does.
    """

    def __init__(
        self,
        archive: ArchiveWriter,
        codec: RecordCodec,
        settings: Settings,
        job_id: str,
        deliver: Callable[[CommandReceived], None],
        *,
        start_at_ms: int,
        on_failure: Callable[[BaseException], None],
        drain_quiet_ms: int = 750,
        drain_max_ms: int = 5000,
    ) -> None:
        from tailguard.log.producer import RecordProducer

        super().__init__(archive, codec)
        self.job_id = job_id
        self._deliver = deliver
        self._signer = signer_for(settings, AGENT)
        self._verifier = verifier_for(settings)
        if isinstance(self._verifier, NoVerification):
            log.warning(
                "job %s: commands are unauthenticated: no security.command-signing.key is set, "
                "so anyone who can write to %s can command this job (see docs/security.md)",
                job_id,
                r.COMMANDS_TOPIC,
            )
        self._producer: RecordProducer | None = RecordProducer(
            settings, codec, config=AGENT_PRODUCER_CONFIG
        )
        self._consumer = RecordConsumer(
            settings,
            codec,
            [r.FINDINGS_TOPIC, r.COMMANDS_TOPIC],
            group_id=f"tailguard-agent-{job_id}",
            start_at_ms=start_at_ms,
            keys=[job_id.encode()],
        )
        self._reader = DecisionReader(
            self._consumer,
            self._take,
            label=f"job {job_id}",
            thread_name="tg-decisions",
            on_failure=on_failure,
            drain_quiet_ms=drain_quiet_ms,
            drain_max_ms=drain_max_ms,
        )

    def _send(self, topic: str, value: bytes, headers: Headers | None = None) -> None:
        if self._producer is None:
            return
        try:
            self._producer.send_bytes(
                topic, self.job_id.encode(), value, headers, wait_s=QUEUE_FULL_WAIT_S
            )
        except QueueFull as err:
            log.error(
                "job %s: %s; publishing to Kafka stops for the rest of the job (the archive "
                "keeps every record; decisions are the local fallbacks')",
                self.job_id,
                err,
            )
            self._drop_producer()

    def publish(self, record: r.Record) -> None:
        # Per-job order on the topic is what the services depend on; the producer keeps it.
        # Signed: with signing on, the services take facts only from an agent.
        self._send_signed(record)
        super().publish(record)

    def local(self, record: r.Record) -> None:
        # On the commands topic too, so the topics alone are a complete log for
        # `tailguard replay --topic`; the agent ignores its own decision when it comes back,
        # as it does any id it has applied.
        self._send_signed(record)
        super().local(record)

    def _send_signed(self, record: r.Record) -> None:
        topic, value = type(record).TOPIC, self.codec.encode(record)
        self._send(topic, value, list(self._signer.headers(topic, value)))

    def _take(self, item: Consumed) -> bool:
        record = item.record
        if record.job_id != self.job_id:  # its key said otherwise: a forged or broken record
            return False
        origin = self._verifier.verify(item.topic, item.raw, item.headers)
        # Archived on arrival, including what comes after the driver stopped applying.
        self._append(record, "received", received_archive_topic(record, item.topic, origin))
        if isinstance(record, r.Command):
            self._deliver(CommandReceived(record, origin))
        return True

    def close(self) -> None:
        """Flush, then keep listening until the services have gone quiet, so the decisions
        they made about the job's last events still reach the archive. The archive is closed
        whatever happens to Kafka meanwhile: what Kafka did not take is in it."""
        try:
            self._flush_for_close()
            self._reader.drain()
        finally:
            try:
                self._reader.stop()
            finally:
                super().close()

    def _flush_for_close(self) -> None:
        if self._producer is None:
            return
        try:
            self._producer.flush(CLOSE_FLUSH_S)
        except DeliveryError as err:
            log.warning(
                "job %s: Kafka did not take every record before the job's end (%s); the "
                "archive holds them all: `tailguard replay` reads it",
                self.job_id,
                err,
            )
        finally:
            self._drop_producer()

    def _drop_producer(self) -> None:
        # A live librdkafka client keeps reconnecting (and logging) after the broker is gone;
        # what it still holds is in the archive.
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.purge()
