"""Cutting an ordered sequence of indices into contiguous ranges (FLIP-187's subpartition ranges).

Two ways, both returning inclusive `(start, end)` pairs that cover `0..n-1` exactly once, in
order, every range non-empty:

- `count_ranges`: FLIP-187's count-based rule, for when nothing is known about sizes yet.
- `balanced_ranges`: the FLIP's "auto-rebalancing" future work: contiguous ranges whose largest
  byte sum is as small as possible (an optimal linear partition), so one heavy subpartition gets
  a range to itself instead of dragging its neighbours into a straggler.
"""

from __future__ import annotations

from collections.abc import Sequence

Range = tuple[int, int]


def _check(n: int, parts: int) -> None:
    if not 1 <= parts <= n:
        raise ValueError(f"cannot cut {n} indices into {parts} non-empty ranges")


def count_ranges(n: int, parts: int) -> list[Range]:
    """FLIP-187: the k-th of `parts` consumers reads `[k·n/parts, (k+1)·n/parts − 1]` (floors).

    With n = 4 subpartitions and 3 consumers that is [0,0], [1,1], [2,3] (the FLIP's Fig. 4 b).
    """
    _check(n, parts)
    return [(k * n // parts, (k + 1) * n // parts - 1) for k in range(parts)]


def _greedy_ranges(weights: Sequence[int], parts: int, limit: int) -> list[Range] | None:
    """Exactly `parts` ranges, none heavier than `limit`, or None if greedy packing needs more.

    Packs left to right and opens a new range when the next index would exceed `limit`, or when
    only as many indices are left as ranges still to open (each of those then gets one index:
    splitting a range never makes its sum larger, so the limit still holds). Greedy packing uses
    the fewest ranges possible under a limit, so None means no cut into `parts` ranges fits.
    """
    n = len(weights)
    ranges: list[Range] = []
    start, total = 0, weights[0]
    if total > limit:
        return None
    for i in range(1, n):
        w = weights[i]
        if w > limit:
            return None
        opened = len(ranges) + 1
        if total + w > limit or n - i == parts - opened:
            ranges.append((start, i - 1))
            if len(ranges) >= parts:
                return None
            start, total = i, w
        else:
            total += w
    ranges.append((start, n - 1))
    return ranges if len(ranges) == parts else None


def balanced_ranges(weights: Sequence[int], parts: int) -> list[Range]:
    """Cut `weights` into `parts` contiguous non-empty ranges minimising the heaviest range.

    Binary search over the limit with greedy packing as the feasibility test:
    O(n · log(sum)). Ties are broken towards even counts: every weight is scaled by n + 1 and
    gets 1 added, so byte sums dominate and, among cuts with the same largest byte sum, one
    with fewer indices in its largest range wins (this is what makes all-zero inputs, e.g. empty
    results, come out count-balanced instead of piling every index into the first range).
    """
    n = len(weights)
    _check(n, parts)
    if any(w < 0 for w in weights):
        raise ValueError("weights must not be negative")
    scale = n + 1
    scaled = [w * scale + 1 for w in weights]
    low, high = max(scaled), sum(scaled)
    while low < high:
        mid = (low + high) // 2
        if _greedy_ranges(scaled, parts, mid) is None:
            low = mid + 1
        else:
            high = mid
    ranges = _greedy_ranges(scaled, parts, low)
    assert ranges is not None  # `low` is feasible: the search only ends on a feasible bound
    return ranges


def range_sums(weights: Sequence[int], ranges: Sequence[Range]) -> list[int]:
    """The weight of each range (for tests, metrics and docs)."""
    return [sum(weights[s : e + 1]) for s, e in ranges]
