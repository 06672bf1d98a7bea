"""The one percentile definition: linear interpolation between the closest ranks.

This is numpy's default (`numpy.percentile(..., method="linear")`) and what docs/benchmarks.md's
p50 and p99 figures are: of n sorted values, the p-th percentile sits at rank (n - 1) * p / 100,
between the two values around it. The 50th of an even count is the mean of the middle two; the
0th and 100th are the smallest and the largest. The job result's dispatch line, `tailguard
bench`, the benchmarks and the LATE baseline's thresholds all use it, so a p99 means the same
everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def percentile(values: Iterable[float], p: float) -> float:
    """The `p`-th percentile (0 <= p <= 100) of `values`, in any order; ValueError when empty."""
    if not 0.0 <= p <= 100.0:
        raise ValueError(f"percentile must be within 0..100, got {p}")
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    rank = (len(ordered) - 1) * p / 100.0
    lo = math.floor(rank)
    hi = math.ceil(rank)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)
