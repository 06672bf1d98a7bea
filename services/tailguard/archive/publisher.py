"""Records to a job's archive with their direction (`published`, `received`, `local`): what an
actuator writes when there is no broker, and what its Kafka publishers build on. The owned
driver's (`agent/adapters/kafka.py`) and observe mode's (`observer/publisher.py`) share it, so it
sits in the log layer below both.
"""

from __future__ import annotations

import threading

from tailguard.archive import ArchiveWriter
from tailguard.codec import RecordCodec
from tailguard.kafka.consumer import Consumed
from tailguard.kafka.signing import NoVerification, SignatureVerifier
from tailguard.model import records as r
from tailguard.model.authority import Origin, received_archive_topic


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

    def _archive_received(
        self, item: Consumed, verifier: SignatureVerifier | NoVerification
    ) -> Origin:
        """Check the signature of a finding or command read back from the log, and archive it
        as received, on arrival: the decision reader's thread is the one that writes what an
        actuator received. One whose signature does not check out is kept apart
        (`received_archive_topic`). Returns what the signature said, for the command intake."""
        origin = verifier.verify(item.topic, item.raw, item.headers)
        self._append(
            item.record, "received", received_archive_topic(item.record, item.topic, origin)
        )
        return origin

    def publish(self, record: r.Record) -> None:
        self._append(record, "published")

    def local(self, record: r.Record) -> None:
        self._append(record, "local")

    def close(self) -> None:
        with self._lock:
            self._archive.close()
