"""Flink 2.x's parallelism and input ranges for a vertex whose inputs have all finished.

Follows `DefaultVertexParallelismAndInputInfosDecider.decideParallelismAndInputInfosForNonSource`
and its two computers, `AllToAllVertexInputInfoComputer` and `PointwiseVertexInputInfoComputer`
(`org.apache.flink.runtime.scheduler.adaptivebatch[.util]`, the source at commit 6da38a6a; the
later POINTWISE change FLINK-37384 is not reproduced, see docs/policies/decider.md):

1. The inputs are grouped by key correlation. ALL_TO_ALL and BROADCAST inputs are correlated
   across inputs (the sides of a join must give subtask k the same keys): they are sliced per
   subpartition index and packed together. POINTWISE and FORWARD inputs are not: each is packed
   on its own, at the parallelism already decided.
2. Each group gets a share of the data volume per task proportional to its bytes
   (`calculateDataVolumePerTaskForInputsGroup`), and each POINTWISE input a share of its
   group's (`calculateDataVolumePerTaskForInput`).
3. ALL_TO_ALL: the parallelism *is* the number of ranges greedy packing makes under the share;
   only when that count is outside [min, max] is the limit searched
   (`adjustToClosestLegalParallelism`), and only when that fails are the subpartitions split by
   count. With a fixed parallelism, or any POINTWISE input, [min, max] is pinned to the
   parallelism decided from the total bytes.
4. POINTWISE: the input is cut into byte-balanced runs of (partition, subpartition) slices, so a
   consumer can have more subtasks than its producer has partitions. FORWARD inputs are sliced
   by whole partitions (intra-input key correlation), so a forward consumer with its producer's
   parallelism reads partition i in subtask i.
5. BROADCAST inputs are read whole by every subtask and are never packed.

tailguard's one addition: the caller bounds [min, max] by what the inputs can feed without an
empty range (`data_bound`), because a tailguard producer may write fewer subpartitions than the
consumer's max parallelism (Flink always writes max-parallelism of them).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tailguard.decider.policy.assign import InputInfo
from tailguard.decider.policy.skew import SkewPlan, split_cuts
from tailguard.decider.policy.slices import (
    Range,
    consumed_subpartition_range,
    data_volume_share,
    try_slice_ranges,
)
from tailguard.model.records import Distribution, InputRange, SubtaskInputs

_POINTWISE = (Distribution.POINTWISE, Distribution.FORWARD)


def is_pointwise(info: InputInfo) -> bool:
    return info.distribution in _POINTWISE


def input_bytes(info: InputInfo) -> int:
    assert info.partition_bytes is not None
    return sum(info.partition_bytes)


def flink_data_bound(inputs: Sequence[InputInfo]) -> int | None:
    """The most subtasks the inputs can feed, none reading an empty range: an ALL_TO_ALL input
    has nsub subpartition slices, a POINTWISE one partitions × nsub, a FORWARD one its
    partitions. None: broadcast inputs only."""
    bounds: list[int] = []
    for i in inputs:
        if i.distribution is Distribution.ALL_TO_ALL:
            bounds.append(i.subpartitions)
        elif i.distribution is Distribution.POINTWISE:
            bounds.append(i.parallelism * i.subpartitions)
        elif i.distribution is Distribution.FORWARD:
            bounds.append(i.parallelism)
    return min(bounds) if bounds else None


def pointwise_subpartitions(consumer_parallelism: int, producers: int) -> int:
    """How many subpartitions each of `producers` partitions holds for a POINTWISE consumer
    that may run `consumer_parallelism` subtasks (its fixed parallelism, else its max).

    Flink sizes a dynamic graph's partitions so the consumer can reach that parallelism with
    every subtask reading at least one (partition, subpartition) slice
    (`IntermediateResultPartition.computeNumberOfMaxPossiblePartitionConsumers`): through Flink
    2.0, ceil(P / producers); later Flink, P / gcd(P, producers), which makes the slice count a
    multiple of P so that even the count-based fallback splits evenly, at up to P subpartitions
    per partition. tailguard takes the first: each subpartition here is a file of its own (an
    open, a checksum and a footer each), and ceil(P / producers) is the fewest files with which
    the consumer still reaches P subtasks and the packer still has P slices to balance bytes
    with (e.g. 4 producers, P 128: 32 files each, where the gcd rule also gives 32; 3
    producers: 43 each, not 128).
    """
    if consumer_parallelism < 1 or producers < 1:
        raise ValueError(
            f"parallelism must be positive: consumer {consumer_parallelism}, producers {producers}"
        )
    return -(-consumer_parallelism // producers)


def compute_vertex_inputs(
    inputs: Sequence[InputInfo],
    parallelism: int,
    min_parallelism: int,
    max_parallelism: int,
    volume: int,
    skew: SkewPlan | None = None,
) -> tuple[SubtaskInputs, ...]:
    """The subtask inputs of a vertex, whose count is its parallelism.

    `parallelism` is the one decided from the total bytes (or fixed); `min_parallelism` and
    `max_parallelism` bound what the ALL_TO_ALL packing may choose (pass `parallelism` for both
    to pin it); `volume` is the data volume per task for the whole vertex. `skew`: a join's
    split slices (`policy/skew.py`), packed instead of one slice per subpartition; if they
    cannot be, the vertex is decided without splitting, within one subtask per subpartition.
    """
    pointwise = [i for i in inputs if is_pointwise(i)]
    all_to_all = [i for i in inputs if not is_pointwise(i)]
    if pointwise:
        min_parallelism = max_parallelism = parallelism
    total = sum(input_bytes(i) for i in inputs)
    per_input: dict[int, list[tuple[InputRange, ...]]] = {}
    if all_to_all:
        share = data_volume_share(volume, sum(input_bytes(i) for i in all_to_all), total)
        cuts = None if skew is None else split_cuts(skew, min_parallelism, max_parallelism, share)
        if cuts is None:
            if skew is not None:  # the bounds were the split slices'; without them, nsub's
                nsub = min(i.subpartitions for i in all_to_all)
                parallelism, max_parallelism = min(parallelism, nsub), min(max_parallelism, nsub)
                min_parallelism = min(min_parallelism, max_parallelism)
            cuts = _all_to_all(all_to_all, parallelism, min_parallelism, max_parallelism, share)
        for info, ranges in zip(all_to_all, cuts, strict=True):
            per_input[id(info)] = ranges
        parallelism = len(cuts[0])
    if pointwise:
        group = sum(input_bytes(i) for i in pointwise)
        share = data_volume_share(volume, group, total)
        for info in pointwise:
            own = data_volume_share(share, input_bytes(info), group)
            per_input[id(info)] = _pointwise(info, parallelism, own)
    counts = {len(ranges) for ranges in per_input.values()}
    assert counts == {parallelism}, f"inputs disagree on the parallelism: {counts}"
    return tuple(
        SubtaskInputs(k, _unique(rng for info in inputs for rng in per_input[id(info)][k]))
        for k in range(parallelism)
    )


# --------------------------------------------------------------------------- ALL_TO_ALL


def _all_to_all(
    inputs: Sequence[InputInfo],
    parallelism: int,
    min_parallelism: int,
    max_parallelism: int,
    volume: int,
) -> list[list[tuple[InputRange, ...]]]:
    """`AllToAllVertexInputInfoComputer` for inputs with inter-input key correlation."""
    non_broadcast = [i for i in inputs if i.distribution is not Distribution.BROADCAST]
    counts = {i.subpartitions for i in non_broadcast}
    if len(counts) == 1:
        nsub = counts.pop()
        slice_bytes = [0] * nsub
        for info in non_broadcast:
            assert info.subpartition_bytes is not None and len(info.subpartition_bytes) == nsub
            for index, size in enumerate(info.subpartition_bytes):
                slice_bytes[index] += size
        ranges = try_slice_ranges(min_parallelism, max_parallelism, volume, slice_bytes)
        if ranges is not None:
            return [[_all_to_all_range(i, rng) for rng in ranges] for i in inputs]
    # No non-broadcast input, no legal parallelism, or (tailguard only) inputs with different
    # subpartition counts: `VertexInputInfoComputationUtils.computeVertexInputInfos`, which
    # splits each input's subpartitions evenly by count over `parallelism` subtasks.
    return [
        [
            _all_to_all_range(i, consumed_subpartition_range(k, parallelism, i.subpartitions))
            for k in range(parallelism)
        ]
        for i in inputs
    ]


def _all_to_all_range(info: InputInfo, subpartitions: Range) -> tuple[InputRange, ...]:
    every = (0, info.parallelism - 1)
    if info.distribution is Distribution.BROADCAST:
        return (InputRange(info.producer, *every, 0, info.subpartitions - 1),)
    return (InputRange(info.producer, *every, *subpartitions),)


# --------------------------------------------------------------------------- POINTWISE


def _slices(info: InputInfo) -> list[tuple[int, int, int, int]]:
    """(partition, first subpartition, last subpartition, bytes), in partition-major order:
    one per partition for FORWARD (intra-input key correlation), else one per subpartition."""
    matrix = info.bytes_by_partition
    assert matrix is not None and len(matrix) == info.parallelism
    nsub = info.subpartitions
    if info.distribution is Distribution.FORWARD:
        return [(p, 0, nsub - 1, sum(row)) for p, row in enumerate(matrix)]
    return [
        (p, s, s, row[s] if s < len(row) else 0)
        for p, row in enumerate(matrix)
        for s in range(nsub)
    ]


def _pointwise(info: InputInfo, parallelism: int, volume: int) -> list[tuple[InputRange, ...]]:
    """`PointwiseVertexInputInfoComputer.computeVertexInputInfo` for one input: exactly
    `parallelism` byte-balanced runs of slices; Flink's count-based pointwise rule
    (`computeVertexInputInfoForPointwise`) if no such runs exist."""
    slices = _slices(info)
    ranges = try_slice_ranges(parallelism, parallelism, volume, [s[3] for s in slices])
    if ranges is not None:
        return [_pointwise_run(info.producer, slices[a : b + 1]) for a, b in ranges]
    return _pointwise_by_count(info, parallelism)


def _pointwise_run(
    producer: str, run: Sequence[tuple[int, int, int, int]]
) -> tuple[InputRange, ...]:
    """A run of slices as input ranges: one per partition, adjacent partitions read with the
    same subpartition range merged (Flink's `computeConsumedSubpartitionGroups`). A run is at
    most a partial partition, whole ones, and a partial one: at most three ranges."""
    spans: list[list[int]] = []  # [partition start, partition end, sub start, sub end]
    for p, s0, s1, _ in run:
        if spans and spans[-1][1] == p:
            spans[-1][3] = s1
        else:
            spans.append([p, p, s0, s1])
    merged: list[list[int]] = []
    for span in spans:
        last = merged[-1] if merged else None
        if last is not None and last[1] + 1 == span[0] and last[2:] == span[2:]:
            last[1] = span[1]
        else:
            merged.append(span)
    return tuple(InputRange(producer, *m) for m in merged)


def _pointwise_by_count(info: InputInfo, parallelism: int) -> list[tuple[InputRange, ...]]:
    """`VertexInputInfoComputationUtils.computeVertexInputInfoForPointwise` (dynamic graph)."""
    sources, nsub = info.parallelism, info.subpartitions
    if sources >= parallelism:
        return [
            (
                InputRange(
                    info.producer,
                    k * sources // parallelism,
                    (k + 1) * sources // parallelism - 1,
                    0,
                    nsub - 1,
                ),
            )
            for k in range(parallelism)
        ]
    out: list[tuple[InputRange, ...]] = []
    for p in range(sources):
        start = (p * parallelism + sources - 1) // sources
        end = ((p + 1) * parallelism + sources - 1) // sources
        for k in range(start, end):
            subs = consumed_subpartition_range(k, end - start, nsub)
            out.append((InputRange(info.producer, p, p, *subs),))
    return out


def _unique(ranges: Iterable[InputRange]) -> tuple[InputRange, ...]:
    """Drop repeats (the same producer read twice over equal ranges, e.g. a self-join)."""
    seen: list[InputRange] = []
    for rng in ranges:
        if rng not in seen:
            seen.append(rng)
    return tuple(seen)
