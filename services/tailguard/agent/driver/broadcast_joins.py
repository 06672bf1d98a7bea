"""The driver's part of the adaptive broadcast join (decider/policy/broadcast_join.py): the
order the two sides of a join are produced in, and what a broadcast decision changes.

Flink decides when an input of an `AdaptiveJoin` finishes and then rewrites the other side's
edge to `ForwardForUnspecifiedPartitioner`, which only works "if it has not yet started
scheduling" (`AdaptiveBroadcastJoinOptimizationStrategy`); both sides of a join are usually
scheduled at once there, so the other side is often shuffled already. tailguard makes the
order right instead: of a join the rule may turn into a broadcast join, the side that may be
broadcast (`first_side`: the right one for left, semi and anti joins, the left one for a right
join, and for an inner join the side whose sources read fewer bytes, once the sources' splits
are known: `sized`) is produced first, and the other side's producer is held until

- the join has its ranges (a broadcast decision, from the decider or the local fallback,
  which decides the same from the same events), or
- the first side has finished too large for the rule: the join stays a shuffled hash join and
  the other side is produced as usual (hash-partitioned).

Holding costs a job whose first side turns out large the overlap of the two producers; a job
whose first side is small gets what the rule is for: the other side is not shuffled at all. The
decision arrives before its producer starts, so the producer is fused into the join: it is
never deployed on its own, and each join subtask runs the producer's chain for the partitions
its range names (their source splits) inside its own attempt, streaming the rows straight into
the join's probe side. Nothing of that side is written to result partitions, read back or sent
over the network, as when Flink chains a forward edge. Only a producer that reads no other
producer's output is fused (a source and the operators chained to it, the usual large side);
one that does writes one subpartition per partition instead, unshuffled, and one that had
started is read as it wrote it (`other_side` says which, and why).

A side whose producer depends on the other side (directly or not) is never held: it could not
finish first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from tailguard.agent.executor.steps import OperatorStep
from tailguard.agent.graph.chaining import ChainDef, ChainedJob
from tailguard.decider.policy.broadcast_join import (
    SIDES,
    BroadcastJoinParams,
    OtherSide,
    adaptive_candidate,
    can_broadcast,
    first_side,
)
from tailguard.model.records import Distribution, Exchange
from tailguard.model.topology import JobGraph


@dataclass(frozen=True)
class Join:
    """A join the decider may turn into a broadcast join, and its sides' producers."""

    how: str
    producers: tuple[str, str]  # left, right
    # Produced first (the side that may be broadcast), and the other side, held until the
    # decision is known; None when holding is not safe (see `_orders`).
    first: str | None = None
    held: str | None = None


class BroadcastJoins:
    def __init__(self, job: ChainedJob, params: BroadcastJoinParams) -> None:
        self.params = params
        self.joins: dict[str, Join] = {}
        for chain in job.vertices.values():
            join = _join(chain, params)
            if join is not None:
                self.joins[chain.name] = join
        self._job = job
        self._order(None)
        # Joins decided broadcast: join -> the producer read broadcast.
        self.broadcast: dict[str, str] = {}
        # Producers told to write one unshuffled subpartition (their join's other side).
        self.unshuffled: set[str] = set()
        # Producers run inside their join's subtasks (its other side): never deployed alone.
        self.fused: dict[str, str] = {}  # producer -> join

    def _order(self, source_bytes: Mapping[str, int] | None) -> None:
        unordered = {name: Join(j.how, j.producers) for name, j in self.joins.items()}
        self.joins = {**unordered, **_orders(self._job, unordered, source_bytes)}
        self._held_by = {j.held: name for name, j in self.joins.items() if j.held is not None}

    def sized(self, split_bytes: Mapping[str, Sequence[int]]) -> None:
        """Order the joins again once the sources' splits are known (`split_bytes`: source ->
        its splits' bytes), before anything is scheduled: an inner join produces first the
        side whose sources read fewer bytes (`first_side`). A driver taking a job over finds
        the same splits (it refuses different ones), so it orders the same."""
        self._order({name: sum(sizes) for name, sizes in split_bytes.items()})

    def join_held_by(self, producer: str) -> str | None:
        return self._held_by.get(producer)

    def holding(self, producer: str, join_initialized: bool, first_bytes: int | None) -> bool:
        """Whether `producer` waits for its join's decision. `first_bytes`: what the join's
        first side produced, None while it runs."""
        name = self._held_by.get(producer)
        if name is None or join_initialized:
            return False
        if first_bytes is None:
            return True
        join = self.joins[name]
        assert join.first is not None
        side = SIDES[join.producers.index(join.first)]
        # Too large: no broadcast decision is coming before both sides are done.
        return can_broadcast(join.how, side, first_bytes, self.params)

    def decided(self, join: str, build: str, layout: OtherSide) -> None:
        """A broadcast decision for `join` is applied: `build` is read broadcast, and the other
        side becomes what `layout` (`other_side`) says."""
        self.broadcast[join] = build
        other = next(p for p in self.joins[join].producers if p != build)
        if layout == "unshuffled":
            self.unshuffled.add(other)
        elif layout == "fused":
            self.fused[other] = join

    def step(self, join: str, step: OperatorStep) -> OperatorStep:
        """The join's step with the broadcast side as its build side."""
        build = self.broadcast.get(join)
        if build is None or step.join is None:
            return step
        side = SIDES[self.joins[join].producers.index(build)]
        return replace(step, join=replace(step.join, build=side))


def _join(chain: ChainDef, params: BroadcastJoinParams) -> Join | None:
    """The decider's candidates (`join_sides` there), seen from the chained graph."""
    how = chain.join_how
    if how is None or chain.parallelism is not None or len(chain.inputs) != 2:
        return None
    if not adaptive_candidate(how, params):
        return None
    left, right = chain.inputs
    if left.producer == right.producer or any(
        i.distribution is not Distribution.ALL_TO_ALL or i.exchange is not Exchange.BLOCKING
        for i in chain.inputs
    ):
        return None
    return Join(how, (left.producer, right.producer))


def _orders(
    job: ChainedJob, joins: dict[str, Join], source_bytes: Mapping[str, int] | None
) -> dict[str, Join]:
    """The joins whose other side may be held, with their order (`source_bytes`: each source's
    bytes, once its splits are known). Holding is safe when the held producer feeds that join
    only (so it is no other join's first side, and nothing else waits for it) and the first
    side does not depend on any held producer. One pass is enough: dropping the unsafe joins
    only shrinks the held set, so every join left stays safe."""
    graph = JobGraph(job.spec())
    ordered: dict[str, Join] = {}
    for name, join in joins.items():
        left, right = join.producers
        sides = None
        if source_bytes is not None:
            sides = (_reads(job, left, source_bytes), _reads(job, right, source_bytes))
        first = right if first_side(join.how, sides) == "right" else left
        held = left if first == right else right
        if len(graph.consumers(held)) == 1:
            ordered[name] = replace(join, first=first, held=held)
    waiting = {j.held for j in ordered.values() if j.held is not None}
    return {
        n: j for n, j in ordered.items() if not (j.first and _ancestors(job, j.first) & waiting)
    }


def _reads(job: ChainedJob, name: str, source_bytes: Mapping[str, int]) -> int:
    """The bytes the sources of `name` (itself, if a source, and its ancestors) read."""
    return sum(source_bytes.get(n, 0) for n in {name} | _ancestors(job, name))


def _ancestors(job: ChainedJob, name: str) -> set[str]:
    seen: set[str] = set()
    todo = [name]
    while todo:
        for i in job.vertices[todo.pop()].inputs:
            if i.producer not in seen:
                seen.add(i.producer)
                todo.append(i.producer)
    return seen
