"""What every codec offers: the log and the services depend on this, not on a framing."""

from __future__ import annotations

from typing import Protocol

from tailguard.model.records import Record


class RecordCodec(Protocol):
    """Turns records into message values and back.

    `decode` raises `DecodeError` (and nothing else) for bytes that are not a readable record;
    `decode(encode(r)) == r` for every record.
    """

    name: str

    def encode(self, record: Record) -> bytes: ...

    def decode(self, data: bytes) -> Record: ...
