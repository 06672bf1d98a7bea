"""Adaptive broadcast join (Flink 2.0, FLIP-470): which side of a join, once produced, is read
broadcast, so that the other side needs no shuffle.

Follows Flink's `AdaptiveBroadcastJoinOptimizationStrategy` (flink-table-runtime,
`org.apache.flink.table.runtime.strategy`) rule for rule:

- `checkInputSideCanBeBroadcast`: a side may be broadcast when its produced bytes are strictly
  below `table.optimizer.join.broadcast-threshold` (Flink's key and default, 1 MiB; -1 turns it
  off) and the join type allows that side as a broadcast build side: inner either side, left,
  semi and anti the right side, right the left side, full neither (the table below: a side
  whose unmatched rows the join keeps must be read by one subtask only);
- `tryOptimizeAdaptiveJoin`: the left side is tried first, then the right, each once all its
  producers have finished;
- `table.optimizer.adaptive-broadcast-join.strategy` (`OptimizerConfigOptions.
  AdaptiveBroadcastJoinStrategy`): `none` turns the rule off. Flink's `auto` also lets the
  planner broadcast a side at compile time from table statistics, and `runtime_only` leaves it
  to run time; tailguard has no planner with statistics (a user's `broadcast()` is the
  compile-time choice, kept under every strategy), so the two behave the same here.

Pure: the bytes, the join type and the settings in, a side or None out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from tailguard.model.config import ConfigError, Settings, parse_size_bytes
from tailguard.model.records import (
    BroadcastJoin,
    Distribution,
    EdgeSpec,
    Exchange,
    InputRange,
    SubtaskInputs,
    VertexSpec,
)

Side = Literal["left", "right"]
# What a broadcast decision makes of the join's other side (`other_side`).
OtherSide = Literal["fused", "unshuffled", "as written"]
SIDES: tuple[Side, Side] = ("left", "right")

THRESHOLD_KEY = "table.optimizer.join.broadcast-threshold"
STRATEGY_KEY = "table.optimizer.adaptive-broadcast-join.strategy"
STRATEGIES = ("auto", "runtime_only", "none")

# The sides each join type may hold as its build side when that side is spread over subtasks
# (broadcast): a side whose unmatched rows the join keeps must be read by one subtask only, or
# every subtask would emit them. Spark's `canBuildBroadcastLeft/Right` and Flink's
# `checkInputSideCanBeBroadcast` agree on this table.
BROADCASTABLE: Mapping[str, frozenset[Side]] = {
    "inner": frozenset({"left", "right"}),
    "left": frozenset({"right"}),
    "right": frozenset({"left"}),
    "full": frozenset(),
    "semi": frozenset({"right"}),
    "anti": frozenset({"right"}),
}


@dataclass(frozen=True, slots=True)
class BroadcastJoinParams:
    """The two settings of the rule, read once per job."""

    # Bytes a side must stay under; <= 0: never (Flink's -1).
    threshold: int
    strategy: str = "auto"

    @classmethod
    def from_settings(cls, settings: Settings) -> BroadcastJoinParams:
        raw = settings.text(THRESHOLD_KEY)
        try:
            threshold = -1 if raw.lstrip().startswith("-") else parse_size_bytes(raw)
        except ConfigError as err:
            raise ConfigError(f"{THRESHOLD_KEY}: {err}") from None
        strategy = settings.text(STRATEGY_KEY).lower()
        if strategy not in STRATEGIES:
            raise ConfigError(f"{STRATEGY_KEY} must be one of {', '.join(STRATEGIES)}")
        return cls(threshold, strategy)

    @property
    def enabled(self) -> bool:
        return self.strategy != "none" and self.threshold > 0


# The rule off (tools and tests that build an execution state without settings).
BROADCAST_OFF = BroadcastJoinParams(threshold=-1, strategy="none")


def can_broadcast(how: str, side: Side, produced_bytes: int, params: BroadcastJoinParams) -> bool:
    """`checkInputSideCanBeBroadcast`: the side is under the threshold and the join type allows
    it as a broadcast build side."""
    return (
        params.enabled
        and produced_bytes < params.threshold
        and side in BROADCASTABLE.get(how, frozenset())
    )


def broadcast_side(
    how: str, produced: Mapping[Side, int], params: BroadcastJoinParams
) -> Side | None:
    """The side to broadcast, among the sides whose producers have all finished (`produced`:
    side -> bytes), left first as Flink tries them; None: keep the shuffled join."""
    for side in SIDES:
        if side in produced and can_broadcast(how, side, produced[side], params):
            return side
    return None


def adaptive_candidate(how: str | None, params: BroadcastJoinParams) -> bool:
    """Whether a join may still be turned into a broadcast join at run time at all."""
    return how is not None and params.enabled and bool(BROADCASTABLE.get(how))


def first_side(how: str, read: tuple[int, int] | None = None) -> Side:
    """The side produced first, so the decision can come before the other side is shuffled:
    the one the join type allows to be broadcast. For an inner join, where either may be, the
    side whose sources read fewer bytes (`read`: left, right, when known for both), since what
    a side produces is known only once it has run, and what it reads is the best guess before;
    on a tie, or unknown, the right one (the build side a shuffled join holds, and Spark's
    preferred broadcast side). A wrong guess costs nothing against not guessing: the first side
    finishes too large, the other is produced as usual, and the rule still tries it."""
    allowed = BROADCASTABLE[how]
    if allowed == frozenset({"left"}):
        return "left"
    if len(allowed) == 2 and read is not None and read[0] < read[1]:
        return "left"
    return "right"


def other_side(started: bool, consumers: int, reads: bool) -> OtherSide:
    """What a broadcast decision makes of the join's other side, from what the agent knows when
    it applies the decision: `fused` into the join (never deployed on its own: its chain runs
    inside the join's subtasks) when it has not started, feeds only this join and reads no
    other producer's output; `unshuffled` (one subpartition per partition) when it reads
    another's output, since the failover service and a takeover track reads per partition of a
    vertex, and reads made through a vertex that never runs would be hidden from both; read
    `as written` when it had started or feeds other consumers too. The agent applies it
    (agent/driver/broadcast_joins.py) and the timeline reads it back from the archive."""
    if started or consumers != 1:
        return "as written"
    return "unshuffled" if reads else "fused"


@dataclass(frozen=True, slots=True)
class Produced:
    """What the decider knows of one producer of a join: its parallelism (once initialised),
    its bytes per partition and subpartition count (once finished)."""

    parallelism: int
    partition_bytes: tuple[int, ...] = ()
    subpartitions: int = 1
    finished: bool = False


def join_sides(
    vertex: VertexSpec, edges: Sequence[EdgeSpec], params: BroadcastJoinParams
) -> tuple[EdgeSpec, EdgeSpec] | None:
    """The (left, right) input edges of a join the rule may still turn into a broadcast join:
    an adaptive join (no fixed parallelism) of two hash-partitioned blocking inputs from two
    producers, of a type that allows a broadcast side, with the rule on. A join the user gave a
    `broadcast()` side already is one (Flink's `isBroadcastJoin`: skip)."""
    if vertex.parallelism is not None or not adaptive_candidate(vertex.join, params):
        return None
    if len(edges) != 2 or edges[0].source == edges[1].source:
        return None
    if any(
        e.distribution is not Distribution.ALL_TO_ALL or e.exchange is not Exchange.BLOCKING
        for e in edges
    ):
        return None
    left, right = sorted(edges, key=lambda e: e.index)
    return left, right


def decide_broadcast_join(
    vertex: VertexSpec,
    edges: Sequence[EdgeSpec],
    produced: Mapping[str, Produced],
    bound: int,
    params: BroadcastJoinParams,
) -> tuple[tuple[SubtaskInputs, ...], BroadcastJoin] | None:
    """The join's ranges as a broadcast join, and why; None to keep it shuffled (for now).

    Once a side whose type allows it has finished under the threshold (`broadcast_side`) and
    the other side's parallelism is known: one subtask per partition of the other side, as
    Flink's `ForwardForUnspecifiedPartitioner` on that edge gives (fewer, each reading a
    contiguous run of its partitions, when the join's max parallelism is lower: rescaled); each
    subtask reads every partition and subpartition of the broadcast side. The other side is
    read in whole partitions: subpartition 0 when it has not finished (the agent runs it inside
    the join's subtasks, or has it write one subpartition, unshuffled, if it has not started;
    otherwise reads all it wrote), all of its subpartitions when it has."""
    sides = join_sides(vertex, edges, params)
    if sides is None:
        return None
    assert vertex.join is not None
    done = {
        side: sum(produced[e.source].partition_bytes)
        for side, e in zip(SIDES, sides, strict=True)
        if e.source in produced and produced[e.source].finished
    }
    side = broadcast_side(vertex.join, done, params)
    if side is None:
        return None
    build = sides[SIDES.index(side)]
    probe = sides[1 - SIDES.index(side)]
    other = produced.get(probe.source)
    if other is None:
        return None  # decided when the other side is initialised
    built = produced[build.source]
    parallelism = max(1, min(other.parallelism, bound))
    probe_last = other.subpartitions - 1 if other.finished else 0
    subtasks: list[SubtaskInputs] = []
    for k in range(parallelism):
        ranges = {
            build.source: InputRange(
                build.source, 0, built.parallelism - 1, 0, built.subpartitions - 1
            ),
            probe.source: InputRange(
                probe.source,
                k * other.parallelism // parallelism,
                (k + 1) * other.parallelism // parallelism - 1,
                0,
                probe_last,
            ),
        }
        subtasks.append(SubtaskInputs(k, tuple(ranges[e.source] for e in sides)))
    why = BroadcastJoin(build.source, side, done[side], params.threshold)
    return tuple(subtasks), why
