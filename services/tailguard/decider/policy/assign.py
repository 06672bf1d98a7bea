"""Which partitions and subpartitions each consumer subtask reads, per distribution pattern.

Shared by the adaptive decisions (sizes known: ranges balanced by bytes) and by the agent's
fixed-parallelism vertices (nothing known yet: FLIP-187's count-based ranges), so a vertex reads
its inputs by the same rules whoever chose its parallelism.

- ALL_TO_ALL: every producer partition (0..Pp−1), a contiguous range of its subpartitions. All
  ALL_TO_ALL inputs of one vertex are cut *together*, on the summed bytes of each subpartition
  index: they are hash-partitioned alike, so both sides of a join must give subtask k the same
  keys, i.e. the same subpartition range.
- FORWARD and POINTWISE: a contiguous range of whole producer partitions. With as many consumer
  subtasks as partitions (a forward group's normal case) that is subtask i -> partition i.
- BROADCAST: every partition, whole.

"Whole" means every subpartition the producer wrote (0..nsub−1): 0..0 when the producer's only
consumers read whole partitions, and still correct when another consumer made it hash-partition.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tailguard.decider.policy.ranges import Range, balanced_ranges, count_ranges
from tailguard.model.records import SPLITS_INPUT, Distribution, InputRange, SubtaskInputs

_WHOLE_PARTITIONS = (Distribution.FORWARD, Distribution.POINTWISE)


@dataclass(frozen=True, slots=True)
class InputInfo:
    """One input of a consumer: its producer and, when known, the sizes it produced."""

    producer: str
    distribution: Distribution
    parallelism: int
    subpartitions: int
    # Bytes of each producer partition, and of each subpartition index summed over partitions.
    # None: not known (a fixed vertex initialised before its producers ran).
    partition_bytes: tuple[int, ...] | None = None
    subpartition_bytes: tuple[int, ...] | None = None
    # Bytes of each (partition, subpartition): what POINTWISE slicing cuts. None: not known.
    bytes_by_partition: tuple[tuple[int, ...], ...] | None = None

    def __post_init__(self) -> None:
        if self.parallelism < 1 or self.subpartitions < 1:
            raise ValueError(f"input {self.producer!r}: parallelism and subpartitions must be ≥ 1")


def data_bound(inputs: Sequence[InputInfo]) -> int | None:
    """The largest parallelism the inputs can feed without a subtask reading nothing: a range
    cannot be empty, so at most nsub subtasks per ALL_TO_ALL input and at most Pp per FORWARD or
    POINTWISE input. None: no such input (BROADCAST only, or a source)."""
    bounds = [
        i.subpartitions if i.distribution is Distribution.ALL_TO_ALL else i.parallelism
        for i in inputs
        if i.distribution is Distribution.ALL_TO_ALL or i.distribution in _WHOLE_PARTITIONS
    ]
    return min(bounds) if bounds else None


def _cut(n: int, parts: int, weights: Sequence[int] | None) -> list[Range]:
    if weights is None:
        return count_ranges(n, parts)
    if len(weights) != n:
        raise ValueError(f"{len(weights)} sizes for {n} indices")
    return balanced_ranges(weights, parts)


def _all_to_all_cuts(parallelism: int, inputs: Sequence[InputInfo]) -> dict[int, list[Range]]:
    """One cut per subpartition count (normally a single one), shared by its inputs.

    Inputs with different subpartition counts cannot be co-partitioned anyway; each count is cut
    on its own inputs' bytes.
    """
    cuts: dict[int, list[Range]] = {}
    for nsub in sorted({i.subpartitions for i in inputs}):
        group = [i for i in inputs if i.subpartitions == nsub]
        weights: list[int] | None = [0] * nsub
        for i in group:
            if i.subpartition_bytes is None or weights is None:
                weights = None
                continue
            if len(i.subpartition_bytes) != nsub:
                raise ValueError(
                    f"input {i.producer!r}: sizes for {len(i.subpartition_bytes)} "
                    f"subpartitions, expected {nsub}"
                )
            weights = [a + b for a, b in zip(weights, i.subpartition_bytes, strict=True)]
        cuts[nsub] = _cut(nsub, parallelism, weights)
    return cuts


def subtask_inputs(parallelism: int, inputs: Sequence[InputInfo]) -> tuple[SubtaskInputs, ...]:
    """The ranges of each of `parallelism` subtasks; byte-balanced where sizes are given.

    Raises ValueError if `parallelism` exceeds `data_bound(inputs)`: the caller clamps.
    """
    bound = data_bound(inputs)
    if parallelism < 1 or (bound is not None and parallelism > bound):
        raise ValueError(f"parallelism {parallelism} outside 1..{bound} for these inputs")
    all_to_all = [i for i in inputs if i.distribution is Distribution.ALL_TO_ALL]
    shared = _all_to_all_cuts(parallelism, all_to_all)
    per_input: list[list[InputRange]] = []
    for i in inputs:
        whole_sub = (0, i.subpartitions - 1)
        if i.distribution is Distribution.ALL_TO_ALL:
            every = (0, i.parallelism - 1)
            ranges = [InputRange(i.producer, *every, s, e) for s, e in shared[i.subpartitions]]
        elif i.distribution in _WHOLE_PARTITIONS:
            cut = _cut(i.parallelism, parallelism, i.partition_bytes)
            ranges = [InputRange(i.producer, s, e, *whole_sub) for s, e in cut]
        else:
            ranges = [InputRange(i.producer, 0, i.parallelism - 1, *whole_sub)] * parallelism
        per_input.append(ranges)
    return tuple(
        SubtaskInputs(k, _unique(ranges[k] for ranges in per_input)) for k in range(parallelism)
    )


def _unique(ranges: Iterable[InputRange]) -> tuple[InputRange, ...]:
    """Drop repeats (the same producer read twice over equal ranges, e.g. a self-join)."""
    seen: list[InputRange] = []
    for rng in ranges:
        if rng not in seen:
            seen.append(rng)
    return tuple(seen)


def split_inputs(parallelism: int, split_bytes: Sequence[int]) -> tuple[SubtaskInputs, ...]:
    """A source's split ranges, contiguous and balanced by bytes.

    A subtask can only get no split when `parallelism` exceeds the number of splits; its inputs
    are then empty (it reads nothing). Keeping parallelism ≤ #splits is the caller's job.
    """
    if parallelism < 1:
        raise ValueError(f"parallelism {parallelism} must be ≥ 1")
    parts = min(parallelism, len(split_bytes))
    cut = balanced_ranges(split_bytes, parts) if parts else []
    return tuple(
        SubtaskInputs(k, (InputRange(SPLITS_INPUT, *cut[k], 0, 0),) if k < parts else ())
        for k in range(parallelism)
    )
