"""Durations as people read them in messages: "0.25 s", "2 s", "12 s", "600 s".

Every timeout and wait in an error or a progress line goes through `seconds_text`: a format of
whole seconds printed a sub-second timeout (a test's or a user's) as "0 s", which reads as a
bug in the message rather than a short timeout.
"""

from __future__ import annotations

__all__ = ["seconds_text"]


def seconds_text(seconds: float) -> str:
    """`seconds` with up to three significant digits below 10 s, whole seconds above."""
    if seconds >= 10:
        return f"{seconds:.0f} s"
    return f"{seconds:.3g} s"
