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

from tailguard.agent.driver.slots import ExecutionVertexId, SlotRequest
from tailguard.model.config import ConfigError, Settings

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


def order_requests(
    requests: Sequence[SlotRequest],
    input_bytes: Callable[[ExecutionVertexId], int | None],
    order: SubtaskOrder,
) -> list[SlotRequest]:
    """New slot requests (vertices in topological order, each vertex's in index order) in the
    order to queue them: vertex by vertex as given, and within a vertex by `order`.

    A request's bytes are its tasks' together (a pipelined region's bulk is ranked by its head's
    vertex), None if any is unknown. Only the requests made together are reordered: the pool
    serves its queue first come first served (FLIP-119), so a subtask that becomes deployable
    later still queues behind the earlier ones.
    """
    if order is SubtaskOrder.INDEX:
        return list(requests)
    by_vertex: dict[str, list[SlotRequest]] = {}
    for request in requests:
        by_vertex.setdefault(request.tasks[0].vertex, []).append(request)

    def request_bytes(request: SlotRequest) -> int | None:
        sizes = [input_bytes(task) for task in request.tasks]
        known = [size for size in sizes if size is not None]
        return sum(known) if len(known) == len(sizes) else None

    return [r for group in by_vertex.values() for r in ordered(group, request_bytes, order)]
