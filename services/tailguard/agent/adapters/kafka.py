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
from collections.abc import Callable

from tailguard.agent.driver.ports import CommandReceived
from tailguard.codec import RecordCodec
from tailguard.log.archive import ArchiveWriter
from tailguard.log.signing import NoVerification, signer_for, verifier_for
from tailguard.model import records as r
from tailguard.model.authority import AGENT, UNAUTHENTICATED_COMMANDS_TOPIC, Unauthentic
from tailguard.model.config import Settings

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


class KafkaPublisher(ArchivePublisher):
    """Facts to Kafka and the archive; decisions from Kafka to the runner.

    A background thread consumes the findings and commands topics: commands for this job go to
    `deliver` with their signature checked (the driver's inbox, where they are validated and
    applied on the driver's thread); findings are only archived, because the agent acts on
    commands, not on findings — but the findings are the speculator's and blocklist's input,
    which a replay needs.
    """

    def __init__(
        self,
        archive: ArchiveWriter,
        codec: RecordCodec,
        settings: Settings,
        job_id: str,
        deliver: Callable[[CommandReceived], None],
        drain_quiet_ms: int = 750,
        drain_max_ms: int = 5000,
    ) -> None:
        from tailguard.log.consumer import RecordConsumer
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
        self._producer = RecordProducer(settings, codec)
        self._consumer = RecordConsumer(
            settings,
            codec,
            [r.FINDINGS_TOPIC, r.COMMANDS_TOPIC],
            group_id=f"tailguard-agent-{job_id}",
            from_beginning=True,
        )
        self._stop = threading.Event()
        self._drain_quiet_ms = drain_quiet_ms
        self._drain_max_ms = drain_max_ms
        self._last_seen = time.monotonic()
        self._thread = threading.Thread(target=self._consume, name="tg-decisions", daemon=True)
        self._thread.start()

    def publish(self, record: r.Record) -> None:
        self._producer.send(record)
        # Per-job order on the topic is what the services depend on; the producer keeps it.
        super().publish(record)

    def local(self, record: r.Record) -> None:
        # On the commands topic too, so the topics alone are a complete log for
        # `tailguard replay --topic`; the agent ignores its own decision when it comes back,
        # as it does any id it has applied.
        topic, value = type(record).TOPIC, self.codec.encode(record)
        headers = self._signer.headers(topic, value)
        self._producer.send_bytes(topic, record.job_id.encode(), value, list(headers))
        super().local(record)

    def _consume(self) -> None:
        while not self._stop.is_set():
            for item in self._consumer.poll(0.1):
                record = item.record
                if record.job_id != self.job_id:
                    continue
                self._last_seen = time.monotonic()
                if not isinstance(record, r.Command):
                    self.received(record)
                    continue
                origin = self._verifier.verify(item.topic, item.raw, item.headers)
                # Archived on arrival, including what comes after the driver stopped applying.
                unauthentic = isinstance(origin, Unauthentic)
                self._append(
                    record, "received", UNAUTHENTICATED_COMMANDS_TOPIC if unauthentic else None
                )
                self._deliver(CommandReceived(record, origin))

    def close(self) -> None:
        """Flush, then keep listening until the services have gone quiet, so the decisions
        they made about the job's last events still reach the archive."""
        self._producer.flush(10.0)
        started = time.monotonic()
        while (time.monotonic() - started) * 1000 < self._drain_max_ms:
            quiet_ms = (time.monotonic() - self._last_seen) * 1000
            if quiet_ms >= self._drain_quiet_ms:
                break
            self._stop.wait(0.05)
        self._stop.set()
        self._thread.join(timeout=5)
        self._consumer.close()
        # Drop the producer now: a live librdkafka client keeps reconnecting (and logging)
        # after the broker is gone.
        del self._producer
        super().close()
