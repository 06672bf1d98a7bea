"""decider decision core (pure): FLIP-187 adaptive parallelism and subpartition ranges.

`ParallelismDecider` turns events into `SetParallelism` commands; `static_subtask_inputs` gives
the agent the ranges of a vertex whose parallelism the user fixed, by the same rules.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tailguard.decider.policy.assign import InputInfo, split_inputs, subtask_inputs
from tailguard.decider.policy.decider import ParallelismDecider
from tailguard.model.records import Distribution, SubtaskInputs

__all__ = ["ParallelismDecider", "static_subtask_inputs"]


def static_subtask_inputs(
    parallelism: int,
    inputs: Sequence[tuple[str, Distribution]],
    producers: Mapping[str, tuple[int, int]],
    split_bytes: tuple[int, ...] | None,
) -> tuple[SubtaskInputs, ...]:
    """Ranges for a vertex with a fixed parallelism, before any size is known.

    `inputs`: (producer, distribution) in input order; `producers`: name -> (parallelism,
    subpartitions). ALL_TO_ALL inputs get FLIP-187's count-based subpartition ranges (subtask k
    of N reads [k·nsub/N, (k+1)·nsub/N − 1]); FORWARD, POINTWISE and BROADCAST the same rules as
    adaptive vertices. A source (`inputs` empty) gets contiguous split ranges balanced by
    `split_bytes`; if `parallelism` exceeds the number of splits the surplus subtasks read
    nothing (empty inputs) — bounding the parallelism is the caller's job.

    Raises ValueError when a FORWARD/POINTWISE producer has fewer partitions, or an ALL_TO_ALL
    producer fewer subpartitions, than `parallelism`: some subtask would have no range.
    """
    if not inputs:
        return split_inputs(parallelism, split_bytes or ())
    infos = [InputInfo(name, distribution, *producers[name]) for name, distribution in inputs]
    return subtask_inputs(parallelism, infos)
