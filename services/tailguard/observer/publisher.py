"""Where an observed application's events go: the agent's own publisher, for many jobs at once.

An observed application is a series of tailguard jobs (one per Spark job, `translate.py`), all
written to one archive, `<archive-dir>/<application id>.avro`, and one producer. The services'
findings and commands about those jobs are received and archived as the agent archives them,
so `tailguard replay` audits an observed application like a job tailguard ran; the commands are
applied only in attach mode (`tailguard.attach`, docs/attach.md), where the relay hands them
to the JVM actuator; observe mode records them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from tailguard import filesystems
from tailguard.archive import ArchiveWriter
from tailguard.archive.publisher import ArchivePublisher
from tailguard.codec import codec_for
from tailguard.kafka.consumer import Consumed, RecordConsumer
from tailguard.kafka.decision_reader import DecisionReader, start_margin_ms
from tailguard.kafka.producer import DeliveryError, RecordProducer
from tailguard.kafka.signing import signer_for, verifier_for
from tailguard.model import records as r
from tailguard.model.authority import AGENT, Origin
from tailguard.model.config import Settings

log = logging.getLogger(__name__)


class ObservedAppPublisher(ArchivePublisher):
    """The agent's archive publisher, plus Kafka: events out, every decision about the
    application's jobs in (archived as received; applied in attach mode only). One producer and
    one consumer for the whole application however many Spark jobs it runs."""

    def __init__(
        self,
        archive: ArchiveWriter,
        settings: Settings,
        app_id: str,
        *,
        drain_quiet_ms: int = 750,
        drain_max_ms: int = 5000,
        on_command: Callable[[r.Command, Origin], None] | None = None,
        start_at_ms: int | None = None,
    ) -> None:
        codec = codec_for(settings)
        self._on_command = on_command
        super().__init__(archive, codec)
        self.job_prefix = f"{app_id}-job-"
        self._producer = RecordProducer(settings, codec)
        self._verifier = verifier_for(settings)
        self._signer = signer_for(settings, AGENT)
        self._consumer = RecordConsumer(
            settings,
            codec,
            [r.FINDINGS_TOPIC, r.COMMANDS_TOPIC],
            group_id=f"tailguard-observe-{app_id}",
            # From the application's attachment (less the clock margin the agent allows the
            # services' hosts), not from the moment this consumer is assigned its partitions: a
            # command sent in between (attach mode) is not missed.
            start_at_ms=(int(time.time() * 1000) if start_at_ms is None else start_at_ms)
            - start_margin_ms(settings),
        )
        self._reader = DecisionReader(
            self._consumer,
            self._take,
            label=f"application {app_id}",
            thread_name="tg-observe-decisions",
            drain_quiet_ms=drain_quiet_ms,
            drain_max_ms=drain_max_ms,
        )

    def publish(self, record: r.Record) -> None:
        # Keyed by the record's job id, as the agent's: per-job order is what the services need.
        # Signed as the agent, whose facts these stand for (the services take events only
        # from an agent when signing is on).
        topic, value = type(record).TOPIC, self.codec.encode(record)
        key = record.job_id.encode()
        self._producer.send_bytes(topic, key, value, list(self._signer.headers(topic, value)))
        super().publish(record)

    def _take(self, item: Consumed) -> bool:
        record = item.record
        if not record.job_id.startswith(self.job_prefix):
            return False
        # Recorded for the audit and the replay (observe mode applies nothing), as the agent
        # archives it: one whose signature does not check out is kept apart from the services'
        # decisions, which the replay compares.
        origin = self._archive_received(item, self._verifier)
        if self._on_command is not None and isinstance(record, r.Command):
            # Attach mode: the relay's command intake judges it, on the relay's thread.
            self._on_command(record, origin)
        return True

    def close(self) -> None:
        """Flush, then listen until the services have gone quiet about the application's last
        events, so their decisions reach the archive; then close it."""
        try:
            try:
                self._producer.flush(10.0)
            except DeliveryError as err:  # the archive holds every record all the same
                log.warning(
                    "observe: Kafka did not take every event (%s); the archive has them", err
                )
            self._reader.drain()
        finally:
            self._reader.stop()
            # A live librdkafka client keeps reconnecting (and logging) after the broker is gone.
            del self._producer
            super().close()


def archive_for(settings: Settings, app_id: str) -> ArchiveWriter:
    work_dir = settings.get("tailguard.work-dir") or "work"
    archive_dir = settings.get("tailguard.archive-dir") or f"{work_dir}/archive"
    return ArchiveWriter(
        filesystems.join(filesystems.normalise(archive_dir), f"{app_id}.avro"),
        spool_dir=f"{work_dir}/archive-spool",
    )


def publisher_for(
    settings: Settings,
    app_id: str,
    *,
    kafka: bool = True,
    on_command: Callable[[r.Command, Origin], None] | None = None,
    start_at_ms: int | None = None,
) -> ArchivePublisher:
    """Kafka and the archive, or the archive alone (no broker: a record of what was seen).
    With `on_command`, every command about the application's jobs goes there too (attach);
    decisions are read from `start_at_ms` (the application's attachment) on."""
    archive = archive_for(settings, app_id)
    if kafka:
        return ObservedAppPublisher(
            archive, settings, app_id, on_command=on_command, start_at_ms=start_at_ms
        )
    return ArchivePublisher(archive, codec_for(settings))
