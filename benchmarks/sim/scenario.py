"""The simulated cluster and job, drawn once from a seed so every policy runs the same one.

The distributions are parameters (`ScenarioParams`) and `describe` prints them, so a table of
results always comes with the exact assumptions behind it:

- a task's input bytes: nominal × uniform(1 − spread, 1 + spread);
- its intrinsic time: lognormal(ln median, σ) for the nominal input, scaled by its bytes (a
  property of the task's data: every attempt of it needs that long on a normal host);
- skewed tasks: a fraction of each stage gets uniform(skew_min, skew_max) × the bytes, and so
  proportionally more time;
- slow hosts: a fraction of the hosts runs everything uniform(slow_min, slow_max) × slower;
  from `slow_onset_ms` on only (attempts started earlier run at full speed: a node that turns
  slow mid-job), and with `io_shares` only the I/O share of each stage's task time (a node slow
  only for I/O: a stage that is mostly I/O is slowed almost fully, a CPU-bound one little);
- each attempt: × lognormal(0, attempt σ), drawn per (task, attempt number), so attempt 0 of a
  task takes the same time under every policy and a mirror attempt has its own luck.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field
from itertools import pairwise

MIB = 1 << 20


@dataclass(frozen=True)
class ScenarioParams:
    hosts: int = 1_000
    slots: int = 2
    tasks: int = 100_000
    seed: int = 1
    # Shares of the tasks per stage; a barrier separates consecutive stages. Non-increasing, so
    # every consumer subtask reads a contiguous range of whole producer subtasks (POINTWISE).
    stage_shares: tuple[float, ...] = (0.4, 0.3, 0.2, 0.1)
    median_ms: float = 20_000.0
    sigma: float = 0.2
    attempt_sigma: float = 0.1
    nominal_bytes: int = 64 * MIB
    bytes_spread: float = 0.2
    slow_fraction: float = 0.02
    slow_min: float = 3.0
    slow_max: float = 8.0
    skew_fraction: float = 0.01
    skew_min: float = 5.0
    skew_max: float = 10.0
    # Slow hosts are slow for attempts that start at or after this simulated ms (0: always).
    slow_onset_ms: int = 0
    # Per stage (the last repeats), the share of a task's time that is I/O, the only share a
    # slow host slows; empty: a slow host slows all of it.
    io_shares: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.hosts < 1 or self.slots < 1 or self.tasks < len(self.stage_shares):
            raise ValueError("need at least one host, one slot and one task per stage")
        if any(b > a for a, b in pairwise(self.stage_shares)):
            raise ValueError(f"stage shares must not increase: {self.stage_shares}")
        if not 0 <= self.slow_fraction <= 1 or not 0 <= self.skew_fraction <= 1:
            raise ValueError("fractions must be within [0, 1]")
        if any(not 0 <= share <= 1 for share in self.io_shares):
            raise ValueError(f"I/O shares must be within [0, 1]: {self.io_shares}")

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Stage:
    index: int
    name: str
    # Per subtask.
    input_bytes: tuple[int, ...]
    intrinsic_ms: tuple[float, ...]
    skewed: tuple[bool, ...]
    # What each subtask writes: sized so that each consumer subtask of the next stage reads
    # exactly its drawn input bytes from its producer range (see `consumer_ranges`).
    output_bytes: tuple[int, ...]

    @property
    def parallelism(self) -> int:
        return len(self.input_bytes)


@dataclass(frozen=True)
class Scenario:
    params: ScenarioParams
    host_factor: tuple[float, ...]
    stages: tuple[Stage, ...]
    # Slot order at the start (hosts shuffled, one entry per slot), so slow hosts are spread.
    initial_slots: tuple[int, ...]
    # Attempt-0 noise per task (global task index), drawn up front.
    first_noise: tuple[float, ...] = field(repr=False)
    stage_offsets: tuple[int, ...] = ()

    @property
    def slow_hosts(self) -> frozenset[int]:
        return frozenset(h for h, f in enumerate(self.host_factor) if f > 1.0)

    def host_time_factor(self, host: int, stage: int, now: int) -> float:
        """How many times longer an attempt of `stage` started at `now` on `host` takes."""
        factor = self.host_factor[host]
        params = self.params
        if factor == 1.0 or now < params.slow_onset_ms:
            return 1.0
        if not params.io_shares:
            return factor
        io = params.io_shares[min(stage, len(params.io_shares) - 1)]
        return 1 - io + io * factor

    def attempt_noise(self, task_index: int, attempt: int) -> float:
        """Per-attempt luck; keyed by (seed, task, attempt) so it is policy independent."""
        if attempt == 0:
            return self.first_noise[task_index]
        sigma = self.params.attempt_sigma
        if sigma == 0:
            return 1.0
        # A string seed is hashed with SHA-512 by `random`, so this is stable across processes.
        rng = random.Random(f"{self.params.seed}/{task_index}/{attempt}")
        return rng.lognormvariate(0.0, sigma)


def stage_sizes(tasks: int, shares: tuple[float, ...]) -> list[int]:
    total = sum(shares)
    sizes = [max(1, math.floor(tasks * s / total)) for s in shares]
    sizes[0] += tasks - sum(sizes)
    return sizes


def consumer_ranges(producers: int, consumers: int) -> list[tuple[int, int]]:
    """Consumer j reads producers [start, end] (inclusive), contiguous and balanced by count."""
    bounds = [producers * j // consumers for j in range(consumers + 1)]
    return [(bounds[j], bounds[j + 1] - 1) for j in range(consumers)]


def build(params: ScenarioParams) -> Scenario:
    rng = random.Random(params.seed)
    hosts = params.hosts
    slow_count = round(params.slow_fraction * hosts)
    slow = set(rng.sample(range(hosts), slow_count))
    factor = tuple(
        rng.uniform(params.slow_min, params.slow_max) if h in slow else 1.0 for h in range(hosts)
    )
    order = list(range(hosts))
    rng.shuffle(order)
    initial_slots = tuple(h for _ in range(params.slots) for h in order)

    sizes = stage_sizes(params.tasks, params.stage_shares)
    mu = math.log(params.median_ms)
    drawn: list[tuple[list[int], list[float], list[bool]]] = []
    for size in sizes:
        skew_count = round(params.skew_fraction * size)
        skewed_set = set(rng.sample(range(size), skew_count))
        input_bytes: list[int] = []
        intrinsic: list[float] = []
        skewed: list[bool] = []
        for subtask in range(size):
            scale = rng.uniform(1 - params.bytes_spread, 1 + params.bytes_spread)
            is_skewed = subtask in skewed_set
            if is_skewed:
                scale *= rng.uniform(params.skew_min, params.skew_max)
            input_bytes.append(max(1, round(params.nominal_bytes * scale)))
            intrinsic.append(rng.lognormvariate(mu, params.sigma) * scale)
            skewed.append(is_skewed)
        drawn.append((input_bytes, intrinsic, skewed))

    stages: list[Stage] = []
    for index, (input_bytes, intrinsic, skewed) in enumerate(drawn):
        if index + 1 < len(drawn):
            output = _outputs_for(len(input_bytes), drawn[index + 1][0])
        else:
            output = [b // 2 for b in input_bytes]
        stages.append(
            Stage(
                index,
                f"stage{index}",
                tuple(input_bytes),
                tuple(intrinsic),
                tuple(skewed),
                tuple(output),
            )
        )
    offsets = [0]
    for size in sizes[:-1]:
        offsets.append(offsets[-1] + size)
    sigma = params.attempt_sigma
    first_noise = tuple(
        rng.lognormvariate(0.0, sigma) if sigma else 1.0 for _ in range(params.tasks)
    )
    return Scenario(params, factor, tuple(stages), initial_slots, first_noise, tuple(offsets))


def _outputs_for(producers: int, consumer_bytes: list[int]) -> list[int]:
    """Producer outputs whose sums over each consumer's range are that consumer's input."""
    out = [0] * producers
    for j, (lo, hi) in enumerate(consumer_ranges(producers, len(consumer_bytes))):
        count = hi - lo + 1
        share, rest = divmod(consumer_bytes[j], count)
        for p in range(lo, hi + 1):
            out[p] = share + (rest if p == lo else 0)
    return out


def describe(params: ScenarioParams) -> list[str]:
    sizes = stage_sizes(params.tasks, params.stage_shares)
    spread = params.bytes_spread
    return [
        f"cluster   {params.hosts:,} hosts x {params.slots} slots"
        f" = {params.hosts * params.slots:,} slots; seed {params.seed}",
        f"job       {params.tasks:,} tasks in {len(sizes)} stages "
        + " -> ".join(f"{n:,}" for n in sizes)
        + " (barrier between stages: a stage starts when the previous one has finished)",
        f"bytes     task input = {params.nominal_bytes / MIB:g} MiB"
        f" x uniform({1 - spread:g}, {1 + spread:g})",
        f"time      task intrinsic time = lognormal(mu=ln({params.median_ms / 1000:g} s),"
        f" sigma={params.sigma:g}) x input / {params.nominal_bytes / MIB:g} MiB;"
        f" each attempt x lognormal(0, {params.attempt_sigma:g})",
        f"skew      {params.skew_fraction:.1%} of each stage's tasks:"
        f" input x uniform({params.skew_min:g}, {params.skew_max:g}), time proportional",
        "slow      no slow host"
        if params.slow_fraction == 0
        else f"slow      {params.slow_fraction:.1%} of hosts: every attempt x"
        f" uniform({params.slow_min:g}, {params.slow_max:g}) (drawn per host)"
        + (f", from {params.slow_onset_ms / 1000:g} s on" if params.slow_onset_ms else "")
        + (
            f", only the I/O share of the task time (per stage: {params.io_shares})"
            if params.io_shares
            else ""
        ),
    ]
