"""What the Kafka clients need from a codec: the part of `tailguard.codec.RecordCodec` they
call.

The clients move bytes; they only need `encode` and `decode`. Depending on this protocol instead of
the codec module keeps the byte-level parts (producer, consumer, dead letters) independent of
the Avro schemas.
"""

from __future__ import annotations

from typing import Protocol

from tailguard.model.records import Record


class Codec(Protocol):
    def encode(self, record: Record) -> bytes: ...

    def decode(self, data: bytes) -> Record: ...
