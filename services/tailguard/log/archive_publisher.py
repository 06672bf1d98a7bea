"""Records to a job's archive with their direction (`published`, `received`, `local`): what an
actuator writes when there is no broker, and what its Kafka publishers build on. The owned
driver's (`agent/adapters/kafka.py`) and observe mode's (`observer/publisher.py`) share it, so it
sits in the log layer below both.
"""

from __future__ import annotations

import threading

from tailguard.codec import RecordCodec
from tailguard.log.archive import ArchiveWriter
from tailguard.model import records as r


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
