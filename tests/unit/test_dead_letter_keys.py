"""Dead letters keep the key of the record they stand for (docs/log.md#dead-letters): the
services' processor and the log's consumer build them through one function."""

from __future__ import annotations

from tailguard.codec import codec_for
from tailguard.kafka.dead_letters import HEADER_OFFSET, HEADER_TOPIC, dead_letter
from tailguard.model import records as r
from tailguard.model.config import Settings
from tailguard.shell.processor import Processor
from tailguard.system.services import Service


class NoDecisions:
    def handle(self, record: r.Record) -> list[r.Record]:
        return []

    def metrics(self) -> dict[str, float]:
        return {}


def test_dead_letter_keeps_the_key_the_bytes_and_where_they_were() -> None:
    topic, key, value, headers = dead_letter(r.EVENTS_TOPIC, 3, 41, b"job-7", b"\x00junk", "bad")
    assert (topic, key, value) == (r.EVENTS_TOPIC + ".dlq", b"job-7", b"\x00junk")
    assert (HEADER_TOPIC, r.EVENTS_TOPIC.encode()) in headers
    assert (HEADER_OFFSET, b"41") in headers


def test_a_services_dead_letter_keeps_the_original_key() -> None:
    definition = Service("failover", r.EVENTS_TOPIC, lambda _s: NoDecisions())
    processor = Processor(definition, Settings(), codec_for(Settings()))
    (dead,) = processor.process(b"not avro", 0, 7, b"job-7")
    assert (dead.topic, dead.key, dead.value) == (r.EVENTS_TOPIC + ".dlq", b"job-7", b"not avro")
    (unkeyed,) = processor.process(b"not avro", 0, 8)
    assert unkeyed.key == b""  # a message without a key: Kafka's null key
