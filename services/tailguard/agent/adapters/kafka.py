"""Where the agent's facts go, and how the services' decisions come back.

Every event the agent publishes and every finding and command it receives is also appended to
the job's Avro archive, the durable audit log that `tailguard replay` reads (the embedded broker
keeps nothing once stopped). Decisions the agent made itself as fallbacks are archived with
direction `local`, so a replay can tell them from the services' own.

With a signing key configured (`security.command-signing.key`), each command's signature is
checked on arrival, and what was found travels with the command to the driver, whose command
intake (`model/command_intake.py`) rejects what did not come from the right service. A command
whose signature does not check out is archived under `UNAUTHENTICATED_COMMANDS_TOPIC`: kept for
the audit, but apart from the services' decisions that a replay compares. The agent signs its
own fallback decisions as `agent`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from tailguard.agent.driver.ports import CommandReceived
from tailguard.archive import ArchiveWriter
from tailguard.archive.publisher import ArchivePublisher
from tailguard.codec import RecordCodec
from tailguard.kafka.consumer import Consumed, RecordConsumer
from tailguard.kafka.decision_reader import DecisionReader
from tailguard.kafka.producer import DeliveryError, Headers, QueueFull
from tailguard.kafka.signing import NoVerification, signer_for, verifier_for
from tailguard.model import records as r
from tailguard.model.authority import AGENT
from tailguard.model.config import Settings

log = logging.getLogger(__name__)


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
        from tailguard.kafka.producer import RecordProducer

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
        # Archived on arrival, including what comes after the driver stopped applying; the
        # driver's command intake judges the command by what its signature said.
        origin = self._archive_received(item, self._verifier)
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
