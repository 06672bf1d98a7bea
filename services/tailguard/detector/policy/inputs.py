"""How many input bytes an attempt was assigned, before it reports any.

FLIP-168 normalises execution time by input size so that a subtask that is slow only because it
was given more data is not taken for a straggler. A finished attempt reports its input bytes; an
unfinished one is judged by what it was assigned: its source splits, or the subpartition ranges
it reads of its producers' outputs (the first finished attempt of each producer subtask, which
is the one consumers read).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import accumulate

from tailguard.model.records import SPLITS_INPUT, InputRange


class ProducerOutputs:
    """Bytes per subpartition written by the first finished attempt of each producer subtask."""

    __slots__ = ("_by_subtask", "_totals")

    def __init__(self) -> None:
        self._by_subtask: dict[int, tuple[int, ...]] = {}
        # Per subpartition, summed over all subtasks recorded: an ALL_TO_ALL consumer reads the
        # same subpartition range of every producer subtask, so its bytes are one slice of this
        # instead of one slice per producer subtask.
        self._totals: list[int] = []

    def record(self, subtask: int, bytes_per_subpartition: Sequence[int]) -> None:
        if subtask in self._by_subtask:
            return
        self._by_subtask[subtask] = tuple(bytes_per_subpartition)
        if len(self._totals) < len(bytes_per_subpartition):
            self._totals.extend([0] * (len(bytes_per_subpartition) - len(self._totals)))
        for index, size in enumerate(bytes_per_subpartition):
            self._totals[index] += size

    def range_bytes(self, rng: InputRange, producer_parallelism: int | None) -> int | None:
        """Bytes of `rng`, or None while a producer subtask in it has not finished."""
        sub = slice(rng.subpartition_start, rng.subpartition_end + 1)
        whole_vertex = (
            producer_parallelism is not None
            and rng.partition_start == 0
            and rng.partition_end == producer_parallelism - 1
            and len(self._by_subtask) == producer_parallelism
        )
        if whole_vertex:
            return sum(self._totals[sub])
        total = 0
        for producer_subtask in range(rng.partition_start, rng.partition_end + 1):
            sizes = self._by_subtask.get(producer_subtask)
            if sizes is None:
                return None
            total += sum(sizes[sub])
        return total


def split_prefix_sums(split_bytes: Sequence[int]) -> tuple[int, ...]:
    """Prefix sums with a leading 0, so a split range's bytes are one subtraction."""
    return (0, *accumulate(split_bytes))


def assigned_bytes(
    ranges: Sequence[InputRange],
    split_prefix: Sequence[int],
    producers: Mapping[str, ProducerOutputs],
    parallelism: Mapping[str, int],
) -> int | None:
    """Input bytes of a subtask reading `ranges`; None when unknown. 0 is a size (Flink takes
    it as the smallest positive one), not "unknown"."""
    total = 0
    for rng in ranges:
        if rng.input == SPLITS_INPUT:
            start, end = rng.partition_start, rng.partition_end + 1
            if start < 0 or end >= len(split_prefix):
                return None
            total += split_prefix[end] - split_prefix[start]
            continue
        outputs = producers.get(rng.input)
        if outputs is None:
            return None
        size = outputs.range_bytes(rng, parallelism.get(rng.input))
        if size is None:
            return None
        total += size
    return total
