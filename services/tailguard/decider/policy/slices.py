"""Greedy packing of subpartition slices into ranges, as Flink 2.x does it.

Follows `VertexParallelismAndInputInfosDeciderUtils` (`tryComputeSubpartitionSliceRange`,
`computeSubpartitionSliceRanges`, `computeParallelism`, `adjustToClosestLegalParallelism`,
`calculateDataVolumePerTaskForInput`) and `BisectionSearchUtils` (`findMinLegalValue`,
`findMaxLegalValue`) of Flink's `org.apache.flink.runtime.scheduler.adaptivebatch`, rule for
rule, including their edge cases (a limit of -1 when a search finds nothing, a 0 share for inputs
without bytes), so a decision here is the decision Flink would take on the same bytes.

A *slice* is one unit the packer cannot cut: a subpartition index (summed over the producer's
partitions) for an ALL_TO_ALL input, a (partition, subpartition) pair for a POINTWISE one. The
packer sees only their byte sizes, position by position; `slice_bytes[i]` is the bytes at
position i summed over the inputs packed together.

With skewed-join splitting (`policy/skew.py`) one input's slice can sit at several positions
(the side not split is read whole by each piece of the other). `parts[i]` then names each
input's slice at position i with its bytes, and a range counts a slice it already holds only
once: Flink's per-type-number buckets in `computeSubpartitionSliceRanges` and
`computeParallelism`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Iterator, Sequence

Range = tuple[int, int]
# Per position: (slice key, bytes) of each input's slice there; equal keys are the same data.
Parts = Sequence[Sequence[tuple[Hashable, int]]]


def data_volume_share(volume: int, group_bytes: int, total_bytes: int) -> int:
    """`calculateDataVolumePerTaskForInput`: (long) (group / total × V).

    Java's 0.0 / 0 is NaN and (long) NaN is 0, so inputs with no bytes at all get a 0 limit.
    """
    if total_bytes == 0:
        return 0
    return int(group_bytes / total_bytes * volume)


def _starts(slice_bytes: Sequence[int], limit: int, parts: Parts | None) -> Iterator[int]:
    """Where `pack` opens each range after the first: left to right, a new range starts when
    the next slice would take the current one above `limit`; a range's first slice always fits.
    With `parts`, a slice the range already holds adds no bytes (Flink's buckets), and a new
    range starts with the position's full bytes."""
    accumulated = 0
    start = 0
    bucket: set[Hashable] = set()
    for i, size in enumerate(slice_bytes):
        here = parts[i] if parts is not None else ()
        new = size - sum(b for key, b in here if key in bucket)
        if i == start or accumulated + new <= limit:
            accumulated += new
        else:
            yield i
            start = i
            accumulated = size
            bucket.clear()
        bucket.update(key for key, _ in here)


def pack(slice_bytes: Sequence[int], limit: int, parts: Parts | None = None) -> list[Range]:
    """`computeSubpartitionSliceRanges`: the ranges `_starts` opens; a range is above the
    limit only when its first slice alone is."""
    bounds = [0, *_starts(slice_bytes, limit, parts), len(slice_bytes)]
    return [(a, b - 1) for a, b in itertools.pairwise(bounds)]


def count_packs(slice_bytes: Sequence[int], limit: int, parts: Parts | None = None) -> int:
    """`computeParallelism`: how many ranges `pack` makes under `limit`."""
    return 1 + sum(1 for _ in _starts(slice_bytes, limit, parts))


def _midpoint(low: int, high: int) -> int:
    """Java's (low + high) / 2: truncated towards zero (Python's // floors)."""
    total = low + high
    return total // 2 if total >= 0 else -(-total // 2)


def find_min_legal_value(legal: Callable[[int], bool], low: int, high: int) -> int:
    """`BisectionSearchUtils.findMinLegalValue`: -1 if `high` is not legal."""
    if not legal(high):
        return -1
    while low <= high:
        mid = _midpoint(low, high)
        if legal(mid):
            high = mid - 1
        else:
            low = mid + 1
    return high + 1


def find_max_legal_value(legal: Callable[[int], bool], low: int, high: int) -> int:
    """`BisectionSearchUtils.findMaxLegalValue`: -1 if `low` is not legal."""
    if not legal(low):
        return -1
    while low <= high:
        mid = _midpoint(low, high)
        if legal(mid):
            low = mid + 1
        else:
            high = mid - 1
    return low - 1


def adjust_to_closest_legal_parallelism(
    limit: int,
    parallelism: int,
    min_parallelism: int,
    max_parallelism: int,
    min_limit: int,
    max_limit: int,
    slice_bytes: Sequence[int],
    parts: Parts | None = None,
) -> list[Range] | None:
    """`adjustToClosestLegalParallelism`: search the byte limit for a count inside the bounds.

    Below the minimum: the largest limit that still gives at least `min_parallelism` ranges,
    then the smallest limit giving that same count (the smaller the limit, the more even the
    ranges). Above the maximum: the smallest limit giving at most `max_parallelism`. None when
    the count found is still outside the bounds.
    """

    def count(value: int) -> int:
        return count_packs(slice_bytes, value, parts)

    adjusted = limit
    if parallelism < min_parallelism:
        adjusted = find_max_legal_value(lambda v: count(v) >= min_parallelism, min_limit, limit)
        reached = count(adjusted)
        adjusted = find_min_legal_value(lambda v: count(v) == reached, min_limit, adjusted)
    elif parallelism > max_parallelism:
        adjusted = find_min_legal_value(lambda v: count(v) <= max_parallelism, limit, max_limit)
    if min_parallelism <= count(adjusted) <= max_parallelism:
        return pack(slice_bytes, adjusted, parts)
    return None


def slice_ranges_by_data(
    min_parallelism: int,
    max_parallelism: int,
    limit: int,
    slice_bytes: Sequence[int],
    parts: Parts | None = None,
) -> list[Range] | None:
    """`tryComputeSubpartitionSliceRangeEvenlyDistributedData`: pack under `limit`; if the count
    is outside [min, max], search the limit (`adjust_to_closest_legal_parallelism`) between the
    smallest slice (at most `limit`) and the total."""
    ranges = pack(slice_bytes, limit, parts)
    if min_parallelism <= len(ranges) <= max_parallelism:
        return ranges
    min_bytes = min([limit, *slice_bytes])
    total = sum(slice_bytes)
    return adjust_to_closest_legal_parallelism(
        limit, len(ranges), min_parallelism, max_parallelism, min_bytes, total, slice_bytes, parts
    )


def slice_ranges_by_count(
    min_parallelism: int, max_parallelism: int, slices: int
) -> list[Range] | None:
    """`tryComputeSubpartitionSliceRangeEvenlyDistributedSubpartitionSlices`: min(slices, max)
    ranges of (nearly) equal slice counts; None with fewer slices than the minimum."""
    if slices < min_parallelism:
        return None
    parallelism = min(slices, max_parallelism)
    return [
        (i * slices // parallelism, (i + 1) * slices // parallelism - 1) for i in range(parallelism)
    ]


def try_slice_ranges(
    min_parallelism: int,
    max_parallelism: int,
    limit: int,
    slice_bytes: Sequence[int],
    parts: Parts | None = None,
) -> list[Range] | None:
    """`tryComputeSubpartitionSliceRange`: by data first, by slice count when that fails."""
    ranges = slice_ranges_by_data(min_parallelism, max_parallelism, limit, slice_bytes, parts)
    if ranges is None:
        ranges = slice_ranges_by_count(min_parallelism, max_parallelism, len(slice_bytes))
    return ranges


def consumed_subpartition_range(consumer: int, consumers: int, subpartitions: int) -> Range:
    """`VertexInputInfoComputationUtils.computeConsumedSubpartitionRange` (dynamic graph, not
    broadcast): consumer k of n reads [k·nsub/n, (k+1)·nsub/n − 1]."""
    index = consumer % consumers
    return (index * subpartitions // consumers, (index + 1) * subpartitions // consumers - 1)


__all__ = [
    "Parts",
    "Range",
    "adjust_to_closest_legal_parallelism",
    "consumed_subpartition_range",
    "count_packs",
    "data_volume_share",
    "find_max_legal_value",
    "find_min_legal_value",
    "pack",
    "slice_ranges_by_count",
    "slice_ranges_by_data",
    "try_slice_ranges",
]
