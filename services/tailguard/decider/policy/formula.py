"""FLIP-187's parallelism formulas, as plain functions of sizes and bounds."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tailguard.model.config import ConfigError, Settings

_PREFIX = "execution.batch.adaptive.auto-parallelism."
ALGORITHM_KEY = "decider.algorithm"
# The default: Flink 2.1's DefaultVertexParallelismAndInputInfosDecider (`policy/flink.py`).
FLINK = "flink-2.1"
# tailguard 1.0's rule, kept as an option: P = ceil(S / (V − capped Sb)), then the optimal
# linear partition of the bytes into exactly P ranges, POINTWISE read in whole partitions.
OPTIMAL = "optimal"
ALGORITHMS = (FLINK, OPTIMAL)


@dataclass(frozen=True, slots=True)
class DeciderParams:
    """The settings one job's decisions use, read once at `JobSubmitted`."""

    volume_per_task: int
    min_parallelism: int
    max_parallelism: int
    default_source_parallelism: int
    normalize_to_power_of_two: bool
    max_broadcast_ratio: float
    algorithm: str = FLINK

    @classmethod
    def from_settings(cls, settings: Settings) -> DeciderParams:
        params = cls(
            volume_per_task=settings.size_bytes(_PREFIX + "avg-data-volume-per-task"),
            min_parallelism=settings.integer(_PREFIX + "min-parallelism"),
            max_parallelism=settings.integer(_PREFIX + "max-parallelism"),
            default_source_parallelism=settings.integer(_PREFIX + "default-source-parallelism"),
            normalize_to_power_of_two=settings.flag(_PREFIX + "normalize-to-power-of-two"),
            max_broadcast_ratio=settings.number(_PREFIX + "max-broadcast-ratio"),
            algorithm=settings.text(ALGORITHM_KEY),
        )
        if params.algorithm not in ALGORITHMS:
            raise ConfigError(f"{ALGORITHM_KEY} must be one of {', '.join(ALGORITHMS)}")
        if params.volume_per_task < 1:
            raise ConfigError(f"{_PREFIX}avg-data-volume-per-task must be at least 1 byte")
        if params.max_parallelism < 1:
            raise ConfigError(f"{_PREFIX}max-parallelism must be at least 1")
        if not 0 <= params.max_broadcast_ratio < 1:
            raise ConfigError(f"{_PREFIX}max-broadcast-ratio must be in [0, 1)")
        return params

    def upper_bound(self, vertex_max_parallelism: int | None) -> int:
        """The largest parallelism a vertex may get: the job's bound and the vertex's own."""
        if vertex_max_parallelism is None:
            return self.max_parallelism
        return max(1, min(self.max_parallelism, vertex_max_parallelism))

    def clamp(self, parallelism: int, upper: int) -> int:
        """Into [min-parallelism, upper]; the upper bound wins if they cross, and never below 1."""
        return max(1, min(upper, max(self.min_parallelism, parallelism)))


def closest_power_of_two(x: int) -> int:
    """FLIP-187's normalize(x): the closest power of two, halfway rounding up (3 -> 4, 5 -> 4)."""
    if x <= 1:
        return 1
    down = 1 << (x.bit_length() - 1)
    if down == x:
        return x
    up = down << 1
    return down if x < (down + up) // 2 else up


def capped_broadcast_bytes(broadcast_bytes: int, params: DeciderParams) -> int:
    """Broadcast bytes count at most max-broadcast-ratio · V: a large broadcast side must not
    inflate the parallelism (each task reads it whole anyway). A ratio of 0 (the default) is
    Flink 2.1's rule: broadcast bytes do not count at all."""
    return min(broadcast_bytes, math.ceil(params.volume_per_task * params.max_broadcast_ratio))


def unclamped_parallelism(
    non_broadcast_bytes: int, broadcast_bytes: int, params: DeciderParams
) -> int:
    """P = ceil(S / (V − min(Sb, ratio·V))), normalised if asked; before any bound applies."""
    per_task = params.volume_per_task - capped_broadcast_bytes(broadcast_bytes, params)
    # ratio < 1 keeps this positive except for V = 1 with a cap that rounds up to 1 byte.
    per_task = max(1, per_task)
    parallelism = max(1, -(-non_broadcast_bytes // per_task))
    if params.normalize_to_power_of_two:
        parallelism = closest_power_of_two(parallelism)
    return parallelism


def flink_parallelism(
    non_broadcast_bytes: int,
    broadcast_bytes: int,
    min_parallelism: int,
    max_parallelism: int,
    params: DeciderParams,
) -> tuple[int, int]:
    """`DefaultVertexParallelismAndInputInfosDecider.decideParallelism` and the data volume per
    task the ranges are packed under: (P, V).

    P = ceil(S / V) clamped to [min, max] (the minimum when there are only broadcast inputs).
    The options change V and P: `max-broadcast-ratio` > 0 takes the capped broadcast bytes off
    V (tailguard 1.0), and `normalize-to-power-of-two` rounds P (FLIP-187), before clamping.
    """
    volume = max(1, params.volume_per_task - capped_broadcast_bytes(broadcast_bytes, params))
    parallelism = -(-non_broadcast_bytes // volume)
    if params.normalize_to_power_of_two:
        parallelism = closest_power_of_two(parallelism)
    return max(min_parallelism, min(max_parallelism, parallelism)), volume


def source_parallelism(total_split_bytes: int, params: DeciderParams) -> int:
    """A source's wish before bounds: default-source-parallelism when set (> 0), else one task
    per V bytes of splits."""
    if params.default_source_parallelism > 0:
        return params.default_source_parallelism
    return max(1, -(-total_split_bytes // params.volume_per_task))
