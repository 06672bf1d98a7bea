"""Skewed join splitting (Flink 2.x, FLIP-475 with FLINK-36159 and FLINK-36333): a join input's
subpartition far above the median is cut along its producer's partitions into several pieces,
each read by its own subtask with the other side's whole matching subpartition.

Follows, rule for rule:

- `AdaptiveSkewedJoinOptimizationStrategy` (flink-table-runtime,
  `org.apache.flink.table.runtime.strategy`): which side a join type lets split (INNER both;
  LEFT, SEMI and ANTI the left; RIGHT the right; FULL neither: each row a side keeps
  unmatched must meet every matching row of the other side in one subtask), that a side is
  split only when one of its subpartitions exceeds its skew threshold, and that a broadcast
  join is never split. Its two strategies differ only for a join whose output edge is
  forwarded to a keyed consumer (Flink's `ForwardForConsecutiveHash`); every keyed consumer in
  tailguard reads through its own hash exchange, so `auto` and `forced` act alike here.
- `AggregatedBlockingInputInfo` and `VertexParallelismAndInputInfosDeciderUtils`
  (`median`, `computeSkewThreshold`, `computeTargetSize`): a subpartition is skewed when its
  bytes exceed max(median × skewed-factor, skewed-threshold); it is cut into pieces of about
  the target size, max(data volume per task, mean of the subpartitions that are not skewed).
- `AllToAllVertexInputInfoComputer` (`createSubpartitionSlicesForInputsWithInterKeysCorrelation`,
  `createBalancedSubpartitionSlicesForInputsWithInterKeysCorrelation`,
  `computePartitionRangesEvenlyData`): per subpartition index, each side's pieces (one, the
  whole subpartition, when not split), and the cartesian product of the two sides' pieces as
  the slices the packer (`slices.py`, with Flink's per-side buckets so a repeated piece counts
  once per range) cuts into subtasks.

tailguard's one addition (`rectangles`): a range of slices must read, for each subpartition, a
*product* of one side's pieces and the other's. When both sides of an inner join are split,
a range that ends inside one row of the product and goes on into the next (say pieces
(A1,B2) and (A2,B1)) would read A1 ∪ A2 and B1 ∪ B2 and emit A1⋈B1 again, which another
subtask also emits; Flink merges such a range's partition ranges the same way. Such a range is
cut at the row boundaries instead, which can add a subtask or two; if that goes above the
vertex's maximum, the vertex is decided without splitting.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise, product

from tailguard.decider.policy.assign import InputInfo
from tailguard.decider.policy.slices import Parts, Range, pack, try_slice_ranges
from tailguard.model.config import ConfigError, Settings
from tailguard.model.records import Distribution, InputRange, SkewSplit, SubtaskInputs

_PREFIX = "table.optimizer.skewed-join-optimization."
STRATEGY_KEY = _PREFIX + "strategy"
FACTOR_KEY = _PREFIX + "skewed-factor"
THRESHOLD_KEY = _PREFIX + "skewed-threshold"
STRATEGIES = ("auto", "forced", "none")

# `applyAdaptiveSkewedJoinOptimization`: the inputs (0 left, 1 right) each join type may split.
SPLITTABLE: dict[str, frozenset[int]] = {
    "inner": frozenset({0, 1}),
    "left": frozenset({0}),
    "semi": frozenset({0}),
    "anti": frozenset({0}),
    "right": frozenset({1}),
    "full": frozenset(),
}


@dataclass(frozen=True, slots=True)
class SkewParams:
    """The skewed-join settings of one job, Flink's keys and defaults."""

    strategy: str = "auto"
    factor: float = 4.0
    threshold: int = 256 * 1024 * 1024

    @classmethod
    def from_settings(cls, settings: Settings) -> SkewParams:
        params = cls(
            strategy=settings.text(STRATEGY_KEY).lower(),
            factor=settings.number(FACTOR_KEY),
            threshold=settings.size_bytes(THRESHOLD_KEY),
        )
        if params.strategy not in STRATEGIES:
            raise ConfigError(f"{STRATEGY_KEY} must be one of {', '.join(STRATEGIES)}")
        if params.factor <= 0:
            raise ConfigError(f"{FACTOR_KEY} must be positive")
        if params.threshold < 0:
            raise ConfigError(f"{THRESHOLD_KEY} must not be negative")
        return params


def median(values: Sequence[int]) -> int:
    """`median`: of the sorted values, the middle one (the mean of the two middle ones, floored
    as Java's long division, for an even count); at least 1."""
    ordered = sorted(values)
    n = len(ordered)
    middle = (ordered[n // 2] + ordered[n // 2 - 1]) // 2 if n % 2 == 0 else ordered[n // 2]
    return max(middle, 1)


def skew_threshold(median_bytes: int, factor: float, threshold: int) -> int:
    """`computeSkewThreshold`: (long) max(median × factor, threshold)."""
    return int(max(median_bytes * factor, threshold))


def target_size(subpartition_bytes: Sequence[int], threshold: int, volume: int) -> int:
    """`computeTargetSize`: max(volume, the mean of the subpartitions not above `threshold`)."""
    normal = [b for b in subpartition_bytes if b <= threshold]
    if not normal:
        return volume
    return max(volume, sum(normal) // len(normal))


def partition_ranges(column: Sequence[int], target: int) -> list[Range]:
    """`computePartitionRangesEvenlyData`: one subpartition's bytes in each producer partition,
    cut left to right into runs, a new run starting when adding the next would reach `target`
    (Flink compares with <, where the packer uses <=: on whole bytes, < target is <= target - 1)."""
    return pack(column, target - 1)


@dataclass(frozen=True, slots=True)
class Piece:
    """What one slice position reads of one input: partitions `partitions` of subpartition
    `subpartition`, `bytes` in all."""

    input: int
    partitions: Range
    subpartition: int
    bytes: int


@dataclass(frozen=True, slots=True)
class SkewPlan:
    """The slices of a join with at least one skewed subpartition split: per position, one
    piece of each input (positions of one subpartition are the cartesian product of the two
    sides' pieces, left major), and the splits made."""

    producers: tuple[str, str]
    partitions: tuple[int, int]
    positions: tuple[tuple[Piece, Piece], ...]
    # Per subpartition: (first position, pieces of the left side, pieces of the right side).
    blocks: tuple[tuple[int, int, int], ...]
    splits: tuple[SkewSplit, ...]

    def slice_bytes(self) -> list[int]:
        return [left.bytes + right.bytes for left, right in self.positions]

    def parts(self) -> Parts:
        return [tuple((piece, piece.bytes) for piece in pos) for pos in self.positions]


def plan_skew(
    inputs: Sequence[InputInfo], join: str | None, params: SkewParams, volume: int
) -> SkewPlan | None:
    """The split slices of a join vertex's inputs, or None when nothing is split: not a join,
    the strategy is none, a broadcast (or any not hash-partitioned) input, no per-partition
    sizes, or no splittable side with a subpartition above its threshold. `volume` is the
    data volume per task of the two inputs' group."""
    splittable = SPLITTABLE.get(join or "", frozenset())
    if params.strategy == "none" or not splittable or len(inputs) != 2:
        return None
    if any(i.distribution is not Distribution.ALL_TO_ALL for i in inputs):
        return None
    if any(i.subpartition_bytes is None or i.bytes_by_partition is None for i in inputs):
        return None
    if inputs[0].producer == inputs[1].producer:
        return None  # a self-join reads one producer's ranges as both sides
    nsub = inputs[0].subpartitions
    if inputs[1].subpartitions != nsub:
        return None
    per_input: list[list[list[Piece]]] = []
    splits: list[SkewSplit] = []
    for index, info in enumerate(inputs):
        sizes = info.subpartition_bytes
        matrix = info.bytes_by_partition
        assert sizes is not None and matrix is not None
        threshold = skew_threshold(median(sizes), params.factor, params.threshold)
        target = target_size(sizes, threshold, volume)
        every = (0, info.parallelism - 1)
        pieces: list[list[Piece]] = []
        for s in range(nsub):
            cut = [every]
            if index in splittable and sizes[s] > threshold:
                column = [row[s] for row in matrix]
                cut = partition_ranges(column, target)
                if len(cut) > 1:
                    splits.append(SkewSplit(info.producer, s, sizes[s], threshold, len(cut)))
            pieces.append(
                [Piece(index, (a, b), s, sum(row[s] for row in matrix[a : b + 1])) for a, b in cut]
            )
        per_input.append(pieces)
    if not splits:
        return None
    positions: list[tuple[Piece, Piece]] = []
    blocks: list[tuple[int, int, int]] = []
    for s in range(nsub):
        lefts, rights = per_input[0][s], per_input[1][s]
        blocks.append((len(positions), len(lefts), len(rights)))
        positions.extend(product(lefts, rights))
    return SkewPlan(
        producers=(inputs[0].producer, inputs[1].producer),
        partitions=(inputs[0].parallelism, inputs[1].parallelism),
        positions=tuple(positions),
        blocks=tuple(blocks),
        splits=tuple(sorted(splits, key=lambda x: (x.subpartition, x.input))),
    )


def rectangles(plan: SkewPlan, ranges: Sequence[Range]) -> list[Range]:
    """`ranges` cut where a range would read a subpartition's pieces as anything but a product
    of a run of left pieces and a run of right pieces (the module docstring says why)."""
    out: list[Range] = []
    for a, b in ranges:
        cuts: set[int] = set()
        for first, lefts, rights in plan.blocks:
            last = first + lefts * rights - 1
            if rights == 1 or lefts == 1 or last < a or first > b:
                continue
            x, y = max(a, first) - first, min(b, last) - first
            if x // rights == y // rights:
                continue  # within one row of the product
            if x % rights:
                cuts.add(first + (x // rights + 1) * rights)
            if y % rights != rights - 1:
                cuts.add(first + (y // rights) * rights)
        bounds = [a, *sorted(cuts), b + 1]
        out.extend((lo, hi - 1) for lo, hi in pairwise(bounds))
    return out


def _ranges_of(producer: str, pieces: Sequence[Piece]) -> tuple[InputRange, ...]:
    """One input's pieces in a subtask as input ranges: per subpartition its partition ranges
    merged where adjacent, then adjacent subpartitions with the same partition range merged
    into one range (so a subtask with nothing split reads one range, as without splitting)."""
    by_sub: dict[int, list[Range]] = {}
    for piece in sorted(set(pieces), key=lambda p: (p.subpartition, p.partitions)):
        runs = by_sub.setdefault(piece.subpartition, [])
        if runs and runs[-1][1] + 1 == piece.partitions[0]:
            runs[-1] = (runs[-1][0], piece.partitions[1])
        else:
            runs.append(piece.partitions)
    merged: list[list[int]] = []  # [partition start, partition end, sub start, sub end]
    for s in sorted(by_sub):
        for a, b in by_sub[s]:
            last = merged[-1] if merged else None
            if last is not None and last[3] + 1 == s and last[0] == a and last[1] == b:
                last[3] = s
            else:
                merged.append([a, b, s, s])
    return tuple(InputRange(producer, *m) for m in merged)


def split_cuts(
    plan: SkewPlan, min_parallelism: int, max_parallelism: int, volume: int
) -> list[list[tuple[InputRange, ...]]] | None:
    """Per input (left, right), each subtask's ranges: the plan's slices packed as Flink packs
    them (`tryComputeSubpartitionSliceRange` over the split slices), then cut into products
    (`rectangles`). None when no legal parallelism exists or the cuts go above the maximum."""
    packed = try_slice_ranges(
        min_parallelism, max_parallelism, volume, plan.slice_bytes(), plan.parts()
    )
    if packed is None:
        return None
    ranges = rectangles(plan, packed)
    if len(ranges) > max_parallelism:
        return None
    return [
        [_ranges_of(producer, [pos[side] for pos in plan.positions[a : b + 1]]) for a, b in ranges]
        for side, producer in enumerate(plan.producers)
    ]


def applied_splits(plan: SkewPlan | None, inputs: Sequence[SubtaskInputs]) -> tuple[SkewSplit, ...]:
    """The plan's splits that the decided ranges use (some subtask reads part of the producer's
    partitions of that subpartition); none when the vertex was decided without splitting."""
    if plan is None:
        return ()
    partial: set[tuple[str, int]] = set()
    partitions = dict(zip(plan.producers, plan.partitions, strict=True))
    for subtask in inputs:
        for rng in subtask.inputs:
            count = partitions.get(rng.input)
            if count is not None and (rng.partition_start > 0 or rng.partition_end < count - 1):
                for s in range(rng.subpartition_start, rng.subpartition_end + 1):
                    partial.add((rng.input, s))
    return tuple(x for x in plan.splits if (x.input, x.subpartition) in partial)
