"""One input record in, encoded outputs out: the part of a service that is not faust.

Kept apart from the faust app so that the rebuild after a restart, the live stream and the tests
all go through the same code.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from tailguard.blocklist import fleet_topic
from tailguard.codec import DecodeError, RecordCodec
from tailguard.kafka.dead_letters import dead_letter_headers, dlq_topic
from tailguard.kafka.signing import ReceivedHeaders, signer_for, verifier_for
from tailguard.model.authority import input_problem
from tailguard.model.config import Settings
from tailguard.model.fleet import FleetBlock
from tailguard.model.policy_settings import SettingsAnnouncer
from tailguard.model.records import Record
from tailguard.shell.metrics_http import ServiceMetrics
from tailguard.shell.snapshot import Position, Snapshot, digest
from tailguard.system.retention import Retained
from tailguard.system.services import Core, Service

log = logging.getLogger("tailguard.service")


@dataclass(frozen=True)
class Outgoing:
    topic: str
    key: bytes
    value: bytes | None
    headers: Sequence[tuple[str, str | bytes | None]] = ()
    # The event time (ms) of the input record it answers; None for a dead letter.
    input_ts: int | None = None


class Processor:
    def __init__(self, definition: Service, settings: Settings, codec: RecordCodec) -> None:
        self.definition = definition
        self.codec = codec
        self.core: Core = definition.core(settings)
        # Its settings, announced to each job before its decisions (model.policy_settings).
        self.announcer = SettingsAnnouncer.of(definition.name, settings)
        log.info(
            "%s: policy settings version %s, set explicitly: %s",
            definition.name,
            self.announcer.version,
            ", ".join(self.announcer.explicit) or "none",
        )
        # The core is fed on faust's event loop and read by the metrics endpoint's thread;
        # a core's metrics() walks its job dicts, which must not change meanwhile.
        self._lock = threading.Lock()
        self.metrics = ServiceMetrics(definition, self._core_values)
        # Every output is signed, findings too: one rule for everything a service emits, and a
        # reader holding the key can tell who wrote any decision (the agent checks commands).
        self._signer = signer_for(settings, definition.name)
        # ...and every input checked, so a core is fed only what its writers signed.
        self._verifier = verifier_for(settings)
        # What a snapshot would hold now: the retained input, and how far it was read.
        self._retention = definition.retention()
        self._retention.attach(self.core)
        self._positions: dict[int, Position] = {}
        # partition -> (next offset, last record's bytes) read since: hashed into a Position only
        # when a snapshot is taken, not for every record (the digest was ~12% of process()).
        self._read_to: dict[int, tuple[int, bytes | None]] = {}
        # partition -> offset below which input is already in the state restored from a snapshot
        # (read past the group's committed offset before the restart): not fed twice.
        self.restored_up_to: dict[int, int] = {}

    def process(
        self,
        raw: bytes | None,
        partition: int,
        offset: int,
        key: bytes | None = None,
        headers: ReceivedHeaders = (),
    ) -> list[Outgoing]:
        """The messages to publish for one input message (outputs, or its dead letter, which
        keeps the message's `key`). With signing on, a message not signed by one of its topic's
        writers is a dead letter too, and the core never sees it."""
        if offset < self.restored_up_to.get(partition, 0):
            # Its outputs were published (a snapshot covers only acknowledged input).
            return []
        self.metrics.processed.inc()
        topic = self.definition.input_topic
        self._read_to[partition] = (offset + 1, raw)
        try:
            record = self.codec.decode(raw or b"")
        except DecodeError as err:
            self.metrics.dead_letters.inc()
            log.warning(
                "%s: record at %s[%d]@%d does not decode, sent to %s: %s",
                self.definition.name,
                topic,
                partition,
                offset,
                dlq_topic(topic),
                err,
                extra={"topic": topic, "partition": partition, "offset": offset},
            )
            return [self._dead_letter(raw, partition, offset, key, str(err))]
        refused = self._refused(raw, headers)
        if refused is not None:
            self.metrics.refused.inc()
            log.warning(
                "%s: %s %s at %s[%d]@%d refused, sent to %s: %s",
                self.definition.name,
                type(record).__name__,
                record.id,
                topic,
                partition,
                offset,
                dlq_topic(topic),
                refused,
                extra={"topic": topic, "partition": partition, "offset": offset},
            )
            return [self._dead_letter(raw, partition, offset, key, refused)]
        with self._lock:
            self._retention.keep(record, Retained(partition, offset, raw or b""))
            outputs = [*self.announcer.before(record), *self.core.handle(record)]
        return [self._outgoing(o, record) for o in outputs]

    def unseen_from(self, partition: int, offset: int) -> int | None:
        """Where the core's input on `partition` stops, if it stops before `offset`: the
        records in between were processed by another instance of the service, which owned the
        partition until a rebalance (scale-out: docs/services.md), and must be fed to the core
        (`replay`) before the record at `offset`. None when the core has seen them all. A
        partition never read counts from its start."""
        if offset < self.restored_up_to.get(partition, 0):
            return None
        if partition in self._read_to:
            seen = self._read_to[partition][0]
        elif partition in self._positions:
            seen = self._positions[partition].next_offset
        else:
            seen = 0
        return seen if seen < offset else None

    def _refused(self, raw: bytes | None, headers: ReceivedHeaders) -> str | None:
        topic = self.definition.input_topic
        return input_problem(topic, self._verifier.verify(topic, raw or b"", headers))

    def _dead_letter(
        self, raw: bytes | None, partition: int, offset: int, key: bytes | None, error: str
    ) -> Outgoing:
        headers = dead_letter_headers(self.definition.input_topic, partition, offset, error)
        return Outgoing(dlq_topic(self.definition.input_topic), key or b"", raw or b"", headers)

    def _outgoing(self, record: Record, cause: Record) -> Outgoing:
        topic, key, value = type(record).TOPIC, record.job_id.encode(), None
        if isinstance(record, FleetBlock):
            # The fleet list (`tailguard.blocklist`) is keyed by host and compacted, in its own
            # encoding: a removal is a tombstone (value None).
            key, value = fleet_topic.encode(record)
        else:
            value = self.codec.encode(record)
        kind = type(record).__name__
        self.metrics.emitted(kind)
        caused_by = getattr(record, "caused_by", ())
        log.info(
            "%s: %s %s for job %s, caused by %s",
            self.definition.name,
            kind,
            record.id,
            record.job_id,
            ", ".join(caused_by) or cause.id,
            extra={"job_id": record.job_id, "record_id": record.id, "caused_by": list(caused_by)},
        )
        headers = self._signer.headers(topic, value or b"")
        return Outgoing(topic, key, value, headers, cause.ts)

    def replay(
        self, raw: bytes | None, partition: int, offset: int, headers: ReceivedHeaders = ()
    ) -> None:
        """Feed an already processed input to rebuild state; its outputs were published before.
        A snapshot's records were checked when they were first read: they come without headers
        and `checked=True`."""
        self._feed_again(raw, partition, offset, headers, checked=False)

    def _feed_again(
        self,
        raw: bytes | None,
        partition: int,
        offset: int,
        headers: ReceivedHeaders,
        checked: bool,
    ) -> None:
        self.metrics.rebuilt.inc()
        self._read_to[partition] = (offset + 1, raw)
        try:
            record = self.codec.decode(raw or b"")
        except DecodeError:
            return  # it went to the dead-letter topic the first time
        if not checked and self._refused(raw, headers) is not None:
            return  # refused the first time, and it went to the dead-letter topic then
        with self._lock:
            self._retention.keep(record, Retained(partition, offset, raw or b""))
            self.core.handle(record)

    def restore(self, snapshot: Snapshot) -> int:
        """Fold a snapshot's records into the (fresh) core; returns how many."""
        for kept in snapshot.records:
            with self._lock:
                # The core's own state (retention.CoreState), else an input record.
                loaded = self._retention.load(kept)
            if not loaded:
                self._feed_again(kept.value, kept.partition, kept.offset, (), checked=True)
        # Read up to there, whatever the last retained record was.
        self._positions = dict(snapshot.positions)
        self._read_to.clear()
        return len(snapshot.records)

    def snapshot(self) -> Snapshot:
        """The state now, as the input it depends on. Taken between two inputs (on the stream's
        loop, after the previous input's outputs were acknowledged), so it covers only input whose
        outputs are on the broker."""
        with self._lock:
            for partition, (at, last) in self._read_to.items():
                self._positions[partition] = Position(at, digest(last))
            self._read_to.clear()
            return Snapshot(
                self.definition.name,
                self.definition.input_topic,
                dict(self._positions),
                tuple(self._retention.records()),
            )

    def _core_values(self) -> dict[str, float]:
        with self._lock:
            return dict(self.core.metrics())
