"""The order in which the driver asks for slots for a vertex's pending subtasks.

`index` (the default) is Flink's and Spark's: subtask 0 first, then 1, and so on. Neither has
another order for batch jobs: Flink's DefaultScheduler / AdaptiveBatchScheduler request slots for
a vertex's execution vertices in index order, and Spark's TaskSetManager offers a stage's tasks
in partition order (locality aside).

`largest-input-first` is longest-processing-time-first (Graham's LPT) with the input bytes as
the estimate of a subtask's time: the subtasks with the most assigned bytes start first, so a
skewed subtask does not start in the last wave and end its stage alone while the other slots are
idle. The bytes are known once the vertex is initialised: source split sizes, and the producers'
finished `bytes_per_subpartition` over the ranges the decider assigned.

Pure: the driver passes in what it knows; no clock is needed, since the order depends only on the
bytes (the time a request may start, its `not_before`, is the pool's business).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import TypeVar

from tailguard.model.config import ConfigError, Settings
from tailguard.model.records import SPLITS_INPUT, InputRange

SETTING = "scheduler.subtask-order"

Item = TypeVar("Item")


class SubtaskOrder(enum.Enum):
    INDEX = "index"
    LARGEST_INPUT_FIRST = "largest-input-first"


def subtask_order(settings: Settings) -> SubtaskOrder:
    """The `scheduler.subtask-order` setting, or a ConfigError naming the known values."""
    raw = settings.text(SETTING)
    try:
        return SubtaskOrder(raw)
    except ValueError:
        known = ", ".join(o.value for o in SubtaskOrder)
        raise ConfigError(f"{SETTING}: unknown order {raw!r}; known: {known}") from None


def ordered(
    items: Sequence[Item], input_bytes: Callable[[Item], int | None], order: SubtaskOrder
) -> list[Item]:
    """`items` (in index order) in the order to request slots for them.

    With `largest-input-first`, most input bytes first; ties and items whose bytes are unknown
    (None) keep their index order, the unknown after the known (there is nothing to rank them
    by, and the known large ones are the ones worth starting early).
    """
    if order is SubtaskOrder.INDEX:
        return list(items)
    sizes = [input_bytes(item) for item in items]
    ranked = sorted(
        range(len(items)),
        key=lambda i: (sizes[i] is None, -(sizes[i] or 0), i),
    )
    return [items[i] for i in ranked]


def assigned_bytes(
    inputs: Sequence[InputRange],
    split_bytes: Sequence[int] | None,
    subpartition_bytes: Callable[[str, int], Sequence[int] | None],
) -> int | None:
    """The bytes a subtask is assigned to read: its source splits, plus the subpartitions of the
    producer partitions in its ranges. None if any of them is not known (a source whose split
    sizes are unknown, a producer partition not yet finished).

    `split_bytes` are the sizes of the subtask's vertex's own splits (a source); and
    `subpartition_bytes(producer, partition)` a finished producer subtask's bytes per
    subpartition, or None.
    """
    total = 0
    for r in inputs:
        for partition in range(r.partition_start, r.partition_end + 1):
            if r.input == SPLITS_INPUT:
                if split_bytes is None or partition >= len(split_bytes):
                    return None
                total += split_bytes[partition]
                continue
            produced = subpartition_bytes(r.input, partition)
            if produced is None or r.subpartition_end >= len(produced):
                return None
            total += sum(produced[r.subpartition_start : r.subpartition_end + 1])
    return total
