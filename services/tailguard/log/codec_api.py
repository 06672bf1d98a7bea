"""What the log needs from a codec: the part of `tailguard.codec.RecordCodec` it calls.

The log moves bytes; it only needs `encode` and `decode`. Depending on this protocol instead of
the codec module keeps the byte-level parts (broker, dead letters) independent of the Avro
schemas. (The archive stores typed records, so it uses the schemas themselves; it takes a
`Codec` only to read archives of the older format, which held encoded records.)
"""

from __future__ import annotations

from typing import Protocol

from tailguard.model.records import Record


class Codec(Protocol):
    def encode(self, record: Record) -> bytes: ...

    def decode(self, data: bytes) -> Record: ...
