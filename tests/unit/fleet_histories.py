"""Long multi-job findings histories for the blocklist: jobs that start, run and end (go silent),
a host slow across jobs (fleet blocks that are extended and expire), noise on healthy hosts,
subtasks slow on two hosts at once (blamed on the task), evidence that ages out between jobs, and
drivers whose clocks disagree by up to `skew_ms`. Each finding comes with the partition it would
be on (keyed by job id, as the findings topic is), in the order a service would read them."""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from speculation_histories import slow_finding

from tailguard.model.records import Record, SlowAttempt, SlowSubtask, SlowTasksDetected

HOSTS = tuple(f"h{i}" for i in range(8))
SLOW_HOST = "h7"
PARTITIONS = 4


@dataclass(frozen=True)
class Read:
    partition: int
    finding: SlowTasksDetected


def partition_of(job_id: str) -> int:
    return zlib.crc32(job_id.encode()) % PARTITIONS


def fleet_history(
    jobs: int, seed: int, start_ms: int = 0, skew_ms: int = 30_000, prefix: str = "job"
) -> list[Read]:
    """`jobs` jobs from `start_ms` on, one starting every 5 s to 6 min, each reporting every 1-3 s
    for 10-40 findings; read in the order of true time (a job's `ts` is off by its clock's skew)."""
    rng = random.Random(seed)
    arrivals: list[tuple[int, int, Read]] = []
    begin = start_ms
    for n in range(jobs):
        job_id = f"{prefix}-{n}"
        begin += rng.choice((5_000, 20_000, 70_000, 150_000, 360_000))
        clock = rng.randint(-skew_ms, skew_ms)
        hosts = tuple(h for h in HOSTS if h == SLOW_HOST or rng.random() < 0.8)
        slow_subtasks = rng.sample(range(12), rng.randint(0, 3))  # slow on the slow host
        at = begin
        for tick in range(rng.randint(10, 40)):
            at += rng.choice((1_000, 2_000, 3_000))
            subtasks = [slow_subtask(s, (SLOW_HOST,)) for s in slow_subtasks if tick >= s]
            if rng.random() < 0.15:  # noise: a healthy host slow once
                subtasks.append(slow_subtask(20 + tick, (rng.choice(hosts),)))
            # A subtask slow on two hosts (the task's fault), when the job has two: a job can
            # draw the slow host alone (seed 462 did), and the other histories stay as they were.
            if len(hosts) >= 2 and rng.random() < 0.05:
                subtasks.append(slow_subtask(40 + tick, tuple(rng.sample(hosts, 2))))
            finding = slow_finding(
                *subtasks,
                job_id=job_id,
                ts=at + clock,
                vertex=rng.choice(("map", "reduce")),
                hosts=hosts,
                finding_id=f"detector-{job_id}-{tick}",
            )
            arrivals.append((at, n, Read(partition_of(job_id), finding)))
    arrivals.sort(key=lambda item: (item[0], item[1]))
    return [read for _, _, read in arrivals]


def on_partitions(
    history: list[Read], encode: Callable[[Record], bytes]
) -> list[tuple[int, int, bytes]]:
    """(partition, offset, encoded finding) in reading order, offsets counted per partition: the
    findings topic as a service reads it."""
    offsets: dict[int, int] = {}
    out = []
    for read in history:
        offset = offsets.get(read.partition, 0)
        offsets[read.partition] = offset + 1
        out.append((read.partition, offset, encode(read.finding)))
    return out


def slow_subtask(subtask: int, hosts: tuple[str, ...]) -> SlowSubtask:
    live = tuple(SlowAttempt(a, h, 90_000, None, a > 0, True) for a, h in enumerate(hosts))
    return SlowSubtask(subtask, live, len(hosts) - 1)
