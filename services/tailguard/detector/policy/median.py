"""Flink's baseline element of a growing multiset of finished attempts, kept incrementally.

`ExecutionTimeBasedSlowTaskDetector.calculateFinishedTaskExecutionTimeMedian` sorts the finished
executions, keeps the K smallest and takes the one at index K/2 (integer division, 0-based): the
lower median for an odd K, the upper one for an even K, never an average of two. That element is
the (K/2 + 1)-th smallest of all finished attempts, so a max-heap of the K/2 + 1 smallest keys
is enough: values are only ever added (a finished attempt stays finished), adding is
O(log K), reading O(1), memory O(K), whatever the number of attempts seen.

Keys are ordered as Flink's sort orders them; equal keys by subtask index (Flink's sort is
stable over the execution vertices in index order). Each key carries its attempt's
(execution time, input bytes), which the baseline needs.
"""

from __future__ import annotations

import heapq

Payload = tuple[int, int | None]


class BaselineElement:
    __slots__ = ("_count", "_heap", "_rank")

    def __init__(self, k: int) -> None:
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        # Rank (1-based) of the element Flink takes: index K/2 of the K smallest.
        self._rank = k // 2 + 1
        # Max-heap of the `_rank` smallest (negated key, negated subtask, negated arrival,
        # payload); the arrival number keeps payloads from ever being compared.
        self._heap: list[tuple[float, int, int, Payload]] = []
        self._count = 0

    @property
    def rank(self) -> int:
        return self._rank

    def __len__(self) -> int:
        return self._count

    def add(self, key: float, subtask: int, payload: Payload) -> None:
        self._count += 1
        entry = (-key, -subtask, -self._count, payload)
        if len(self._heap) < self._rank:
            heapq.heappush(self._heap, entry)
        elif entry > self._heap[0]:  # smaller than the largest kept (by key, then subtask)
            heapq.heapreplace(self._heap, entry)

    def element(self) -> Payload | None:
        """The (time, bytes) of the baseline element, or None while fewer than its rank were
        added (Flink only asks once K ≥ rank attempts have finished)."""
        if len(self._heap) < self._rank:
            return None
        return self._heap[0][3]

    def key(self) -> float | None:
        if len(self._heap) < self._rank:
            return None
        return -self._heap[0][0]
