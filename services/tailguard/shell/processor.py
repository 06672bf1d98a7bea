"""One input record in, encoded outputs out: the part of a service that is not faust.

Kept apart from the faust app so that the rebuild after a restart, the live stream and the tests
all go through the same code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tailguard.codec import DecodeError, RecordCodec
from tailguard.log.dead_letters import dead_letter_headers, dlq_topic
from tailguard.log.signing import signer_for
from tailguard.model.config import Settings
from tailguard.model.records import Record
from tailguard.shell.definition import Core, ServiceDefinition


@dataclass(frozen=True)
class Outgoing:
    topic: str
    key: bytes
    value: bytes
    headers: Sequence[tuple[str, str | bytes | None]] = ()


@dataclass
class Counters:
    processed: int = 0
    emitted: int = 0
    dead_letters: int = 0
    rebuilt: int = 0


class Processor:
    def __init__(
        self, definition: ServiceDefinition, settings: Settings, codec: RecordCodec
    ) -> None:
        self.definition = definition
        self.codec = codec
        self.core: Core = definition.core(settings)
        self.counters = Counters()
        # Every output is signed, findings too: one rule for everything a service emits, and a
        # reader holding the key can tell who wrote any decision (the agent checks commands).
        self._signer = signer_for(settings, definition.name)

    def process(self, raw: bytes | None, partition: int, offset: int) -> list[Outgoing]:
        """The messages to publish for one input message (outputs, or its dead letter)."""
        self.counters.processed += 1
        topic = self.definition.input_topic
        try:
            record = self.codec.decode(raw or b"")
        except DecodeError as err:
            self.counters.dead_letters += 1
            headers = dead_letter_headers(topic, partition, offset, str(err))
            return [Outgoing(dlq_topic(topic), b"", raw or b"", headers)]
        out = [self._outgoing(o) for o in self.core.handle(record)]
        self.counters.emitted += len(out)
        return out

    def _outgoing(self, record: Record) -> Outgoing:
        topic, value = type(record).TOPIC, self.codec.encode(record)
        return Outgoing(topic, record.job_id.encode(), value, self._signer.headers(topic, value))

    def replay(self, raw: bytes | None) -> None:
        """Feed an already processed input to rebuild state; its outputs were published before."""
        self.counters.rebuilt += 1
        try:
            record = self.codec.decode(raw or b"")
        except DecodeError:
            return  # it went to the dead-letter topic the first time
        self.core.handle(record)

    def metrics(self) -> dict[str, float]:
        values: dict[str, float] = {
            "records_processed": self.counters.processed,
            "records_emitted": self.counters.emitted,
            "dead_letters": self.counters.dead_letters,
            "records_rebuilt": self.counters.rebuilt,
        }
        values.update(self.core.metrics())
        return values
