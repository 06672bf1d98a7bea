"""The one error a consumer catches for bytes it cannot turn into a record."""

from __future__ import annotations


class DecodeError(ValueError):
    """Bytes that are not a record this codebase can read.

    Raised for a wrong marker, an unknown fingerprint or schema id, a truncated or malformed
    body and trailing bytes; the message says which. A consumer sends such a message to the
    dead-letter topic and goes on.
    """
