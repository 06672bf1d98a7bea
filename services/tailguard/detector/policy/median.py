"""The median of the k smallest values of a growing multiset, kept incrementally.

The detector's baseline is the median of the K fastest finished attempts of a vertex. Values are
only ever added (a finished attempt stays finished), so the k smallest are a max-heap of the
lower half plus, for an even k, the single smallest value above it: that value can only
decrease, and nothing larger is ever needed again. Adding is O(log k), reading O(1), memory O(k),
whatever the number of values seen.
"""

from __future__ import annotations

import heapq


class SmallestKMedian:
    __slots__ = ("_count", "_k", "_lower", "_lower_size", "_next_above")

    def __init__(self, k: int) -> None:
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        self._k = k
        # Rank (1-based) of the lower median among the k smallest.
        self._lower_size = (k + 1) // 2
        # Negated values: a max-heap of the `_lower_size` smallest values.
        self._lower: list[float] = []
        # The smallest value above the lower half (rank `_lower_size + 1`), once there is one.
        self._next_above: float | None = None
        self._count = 0

    @property
    def k(self) -> int:
        return self._k

    def __len__(self) -> int:
        return self._count

    def add(self, value: float) -> None:
        self._count += 1
        if len(self._lower) < self._lower_size:
            heapq.heappush(self._lower, -value)
            return
        if value < -self._lower[0]:
            value = -heapq.heapreplace(self._lower, -value)
        if self._next_above is None or value < self._next_above:
            self._next_above = value

    def median(self) -> float | None:
        """Median of the k smallest values, or None while fewer than k were added."""
        if self._count < self._k:
            return None
        lower_median = -self._lower[0]
        if self._k % 2:
            return lower_median
        assert self._next_above is not None  # k even and count >= k >= 2
        return (lower_median + self._next_above) / 2
