"""Adaptive parallelism for an attached application's query stages (pure: model only).

Spark's adaptive query execution plans a query stage once the shuffles it reads have been
written. The attach jar's query-stage rule (`java/tailguard/attach/ParallelismRule.java`) then
hands the map outputs' bytes per reducer partition to the relay, one request per set of reads
Spark coalesced with the same ranges (the two sides of a join are one set), and waits a bounded
time for the ranges to read them with.

Each request becomes a small tailguard job of its own, as the events the decider already reads
(FLIP-187: a consumer is decided when every producer has finished):

- `JobSubmitted`: a producer vertex `shuffle-<id>` per shuffle, its parallelism fixed at 1 (the
  map outputs summed: Spark's `MapOutputStatistics`), and one undecided consumer vertex
  `reader`, ALL_TO_ALL from each producer, at most one subtask per reducer partition and at
  least what the rule asks (Spark's own floor: its default parallelism unless the user set
  `spark.sql.adaptive.coalescePartitions.minPartitionNum`, but at most one per
  `minPartitionSize` of the shuffled bytes, as Spark's `ShufflePartitionsUtil` sizes it);
- per producer, its one attempt finishing with the bytes of each reducer partition as its
  subpartitions.

The decider's `SetParallelism` for `reader` names, per consumer subtask, the subpartition range
of each input; for ALL_TO_ALL inputs those are the same for every input (Flink 2.x correlates
the inputs of a join by key), so they are contiguous reducer ranges Spark can read: the
`ends` of `CoalescedPartitionSpec`s. The rule's end line (`PE`) closes the job: with the ranges
applied, or with Spark's own kept (no decision within `tailguard.attach.decision-timeout`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tailguard.model import records as r

__all__ = ["PLAN_VERTEX", "PlanRequest", "parse_request", "plan_ends", "plan_job_events"]

# The consumer vertex of a plan job: the query stage whose reads are being planned.
PLAN_VERTEX = "reader"
# The host of a plan job's producer attempts: the map outputs are summed on the driver.
PLAN_HOST = "driver"


@dataclass(frozen=True)
class PlanRequest:
    """One query stage's reads awaiting ranges, as the rule sent them (`PS` line)."""

    request: int
    job_id: str
    ts: int
    partitions: int
    min_parallelism: int
    # Per input (a shuffle): its vertex name and its bytes per reducer partition.
    inputs: tuple[tuple[str, tuple[int, ...]], ...]


def shuffle_vertex(shuffle: int) -> str:
    return f"shuffle-{shuffle}"


def parse_request(f: Sequence[str], job_id: Callable[[int], str]) -> PlanRequest:
    """`ts request partitions min-parallelism shuffle:b0,b1,... [shuffle:...]`."""
    ts, request, partitions, floor = int(f[0]), int(f[1]), int(f[2]), int(f[3])
    if partitions < 1:
        raise ValueError(f"{partitions} reducer partitions")
    inputs: list[tuple[str, tuple[int, ...]]] = []
    for spec in f[4:]:
        shuffle, _, sizes = spec.partition(":")
        sizes_t = tuple(int(b) for b in sizes.split(",")) if sizes else ()
        if len(sizes_t) != partitions:
            raise ValueError(
                f"shuffle {shuffle} gives {len(sizes_t)} partition sizes, not {partitions}"
            )
        inputs.append((shuffle_vertex(int(shuffle)), sizes_t))
    if not inputs:
        raise ValueError("a plan request without inputs")
    return PlanRequest(
        request, job_id(request), ts, partitions, max(1, min(floor, partitions)), tuple(inputs)
    )


def plan_job_events(
    plan: PlanRequest, name: str, config: Mapping[str, str], next_id: Callable[[], str]
) -> list[r.Event]:
    """The plan job's events, submission to the producers' results."""
    ts, job = plan.ts, plan.job_id
    vertices = [
        r.VertexSpec(name=v, kind=r.VertexKind.SOURCE, parallelism=1) for v, _ in plan.inputs
    ]
    vertices.append(
        r.VertexSpec(
            name=PLAN_VERTEX,
            kind=r.VertexKind.OPERATOR,
            parallelism=None,  # the decider's
            max_parallelism=plan.partitions,
            min_parallelism=plan.min_parallelism,
        )
    )
    edges = tuple(
        r.EdgeSpec(v, PLAN_VERTEX, r.Distribution.ALL_TO_ALL, index=i)
        for i, (v, _) in enumerate(plan.inputs)
    )
    out: list[r.Event] = [
        r.JobSubmitted(
            job_id=job,
            ts=ts,
            id=next_id(),
            name=name,
            graph=r.JobGraphSpec(tuple(vertices), edges),
            config=dict(config),
        )
    ]
    for vertex, sizes in plan.inputs:
        out.append(
            r.VertexInitialized(
                job_id=job,
                ts=ts,
                id=next_id(),
                vertex=vertex,
                parallelism=1,
                subtask_inputs=(),
                decided_by="spark",
            )
        )
        common: dict[str, Any] = {
            "job_id": job,
            "ts": ts,
            "vertex": vertex,
            "subtask": 0,
            "attempt": 0,
        }
        out.append(r.AttemptDeploying(**common, id=next_id(), host=PLAN_HOST, speculative=False))
        out.append(
            r.AttemptFinished(
                **common,
                id=next_id(),
                host=PLAN_HOST,
                input_bytes=sum(sizes),
                records=0,
                bytes_per_subpartition=sizes,
                checksums=(),
            )
        )
    return out


def plan_ends(command: r.SetParallelism, plan: PlanRequest) -> tuple[int, ...] | str:
    """The exclusive end of each consumer subtask's reducer range, or why `command`'s ranges
    cannot be Spark's: every input of a subtask must read the same contiguous range of reducer
    partitions, and the ranges must cover them all in order, each once."""
    if command.vertex != PLAN_VERTEX:
        return f"unknown vertex {command.vertex!r} (a query-stage plan decides {PLAN_VERTEX!r})"
    names = {v for v, _ in plan.inputs}
    subtasks = sorted(command.subtask_inputs, key=lambda s: s.subtask)
    if command.parallelism != len(subtasks) or [s.subtask for s in subtasks] != list(
        range(len(subtasks))
    ):
        return f"parallelism {command.parallelism} with {len(subtasks)} subtasks' inputs"
    ends: list[int] = []
    start = 0
    for s in subtasks:
        ranges = {(i.subpartition_start, i.subpartition_end) for i in s.inputs}
        if {i.input for i in s.inputs} != names or len(ranges) != 1:
            return (
                f"subtask {s.subtask} reads its inputs with different ranges: Spark reads "
                f"every input of a query stage with one set of reducer ranges"
            )
        if any((i.partition_start, i.partition_end) != (0, 0) for i in s.inputs):
            return f"subtask {s.subtask} reads producer subtasks a plan job does not have"
        first, last = ranges.pop()
        if first != start or last < first:
            return f"subtask {s.subtask} reads reducer partitions {first}..{last}, not from {start}"
        start = last + 1
        ends.append(start)
    if start != plan.partitions:
        return f"the ranges end at reducer partition {start}, not {plan.partitions}"
    return tuple(ends)
