"""Checks shared by both framings before a body is read."""

from __future__ import annotations

from typing import Any

from tailguard.codec.errors import DecodeError


def as_bytes(data: Any) -> bytes:
    """`data` as bytes; a missing value (a Kafka tombstone) or a non-bytes one is a DecodeError."""
    if isinstance(data, bytes):
        return data
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    kind = "no value (a tombstone?)" if data is None else f"a {type(data).__name__}"
    raise DecodeError(f"expected the bytes of a message, got {kind}")
