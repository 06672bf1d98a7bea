"""seconds_text: a sub-second timeout keeps its digits; long ones are whole seconds."""

from __future__ import annotations

import pytest

from tailguard.model.durations import seconds_text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.25, "0.25 s"),
        (0.1, "0.1 s"),
        (0.0, "0 s"),
        (2.0, "2 s"),
        (1.234, "1.23 s"),
        (9.99, "9.99 s"),
        (10.0, "10 s"),
        (59.6, "60 s"),
        (600.0, "600 s"),
        (3600.0, "3600 s"),
    ],
)
def test_seconds_text(seconds: float, text: str) -> None:
    assert seconds_text(seconds) == text
