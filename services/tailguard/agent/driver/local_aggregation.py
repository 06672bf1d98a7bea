"""Two-phase aggregation: which producers aggregate locally before the exchange.

Flink plans `partition_by(keys).aggregate(...)`'s equivalent (`GROUP BY` with merge-able
functions) as a local aggregate at the producers and a global one after the shuffle
(`table.optimizer.agg-phase-strategy`, default AUTO: two phases whenever every function can
merge, which sum, count, min, max and mean all can); Spark's `HashAggregateExec` does the same
(its partial aggregation before `Exchange`). tailguard follows them: a producer whose consumers
all run the same built-in aggregation by the keys they are partitioned on writes partial states
(`executor/aggregation.py`, `partial_states`), and the consumers merge them.

**Why this, not a skew split, serves `partition_by().aggregate`.** A join's skewed subpartition
is split along its producers' partitions, each piece read by its own subtask (decider/policy/
skew.py). An aggregation's pieces would each emit a partial state of the same keys, which would
need a merge after them: a third phase, with the hot key still crossing the exchange as rows. The
local phase moves that merge before the exchange: a key's rows leave a producer as one state row
per flush (one per producer for a hot key), the state of every built-in function has a fixed size,
so after it a subpartition's bytes are its distinct keys' states, which the key hash spreads
evenly. Nothing is left for a split to cut: the hot subpartition is no longer skewed.

A producer qualifies when every edge it feeds is ALL_TO_ALL on keys that the consumer's head step
(an `aggregate`, its chain's only input) groups by, with the same aggregations for all of them.
Anything else (a consumer that needs rows, a broadcast join's other side) keeps rows.
ONE_PHASE turns it off, as in Flink.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from tailguard.agent.executor.aggregation import LocalPhase
from tailguard.agent.executor.steps import OperatorStep
from tailguard.agent.graph.chaining import ChainDef, ChainedJob
from tailguard.model.config import ConfigError, Settings
from tailguard.model.records import Distribution

STRATEGY_KEY = "table.optimizer.agg-phase-strategy"
STRATEGIES = ("AUTO", "TWO_PHASE", "ONE_PHASE")


def strategy_of(settings: Settings) -> str:
    strategy = settings.text(STRATEGY_KEY).strip().upper()
    if strategy not in STRATEGIES:
        choices = ", ".join(STRATEGIES)
        raise ConfigError(f"{STRATEGY_KEY} must be one of {choices}, got {strategy!r}")
    return strategy


class LocalAggregation:
    """The plan: each qualifying producer's local phase, and the consumers that merge states.
    `consumers`: each producer's consumers (`ExecutionState.consumers`)."""

    def __init__(
        self,
        job: ChainedJob,
        consumers: Mapping[str, Sequence[tuple[str, int]]],
        strategy: str = "AUTO",
    ) -> None:
        self.phases: dict[str, LocalPhase] = {}
        self.merging: set[str] = set()
        if strategy == "ONE_PHASE":
            return
        for producer, edges in consumers.items():
            chains = [job.vertices[consumer] for consumer, _ in edges]
            phase = _phase(chains)
            if phase is not None:
                self.phases[producer] = phase
                self.merging.update(c.name for c in chains)

    def phase(self, producer: str) -> LocalPhase | None:
        """What `producer` aggregates before its exchange, None when it writes rows."""
        return self.phases.get(producer)

    def step(self, vertex: str, step: OperatorStep) -> OperatorStep:
        """`vertex`'s step as it runs: its aggregation merges partial states if its producer
        ran the local phase. (An `aggregate` only follows a keyed exchange, so it heads its
        chain: a merging chain has no other.)"""
        if vertex in self.merging and step.style == "aggregate":
            return replace(step, merging=True)
        return step


def _phase(chains: list[ChainDef]) -> LocalPhase | None:
    """The local phase every one of a producer's consumers can merge, if there is one."""
    phases = {_aggregation_read(chain) for chain in chains}
    if len(phases) != 1:
        return None
    (phase,) = phases
    return phase


def _aggregation_read(chain: ChainDef) -> LocalPhase | None:
    """The aggregation `chain` runs on its one keyed input as it reads it, if it does."""
    if chain.source is not None or len(chain.inputs) != 1 or not chain.steps:
        return None
    (edge,) = chain.inputs
    head = chain.steps[0]
    if (
        edge.distribution is not Distribution.ALL_TO_ALL
        or not edge.keys
        or head.style != "aggregate"
        or head.keys != edge.keys
    ):
        return None
    return LocalPhase(head.keys, head.aggregations, head.name)
