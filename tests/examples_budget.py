"""How many examples a property test draws (Hypothesis `max_examples`).

Each property test names the number it was written with: `max_examples=examples(200)`. A plain
`pytest` run, and `make test-long`, draw them all. `make test` sets
`TAILGUARD_PROPERTY_EXAMPLES=0.25` and draws a quarter (at least 10): every property still runs
on every change, and the full search runs in CI after it, within make test's time budget.
"""

from __future__ import annotations

import os

ENV = "TAILGUARD_PROPERTY_EXAMPLES"


def examples(full: int) -> int:
    """The number of examples to draw for a test written with `full`."""
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return full
    share = float(raw)
    if not 0 < share <= 1:
        raise ValueError(f"{ENV}={raw!r}: a share in (0, 1]")
    return max(min(10, full), round(full * share))
