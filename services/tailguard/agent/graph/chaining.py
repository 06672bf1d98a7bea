"""Operator chaining: consecutive operators that can share a task become one vertex.

Flink's `StreamingJobGraphGenerator` cuts the user's operators into chains; a chain is what the
scheduler sees as a JobVertex, runs as one task per subtask, and passes records along inside the
task with no result partition in between. tailguard does the same before a job runs: the
execution graph, the events, findings, commands and metrics are all about chains.

An edge producer -> consumer is chained when (Flink's `isChainable`, for a batch graph):

- it is FORWARD (an exchange: `partition_by`, `rebalance`, `broadcast` moves records between
  subtasks, so it needs a result partition) and BLOCKING (a PIPELINED edge asks for two tasks
  deployed together, FLIP-119);
- both ends declare the same parallelism (`None == None`: two adaptive vertices joined by a
  FORWARD edge share one parallelism anyway, through their forward group);
- the consumer has exactly this one input (a join heads a chain) and the producer exactly this
  one consumer (a chain is a straight line of steps with one output);
- the producer is not a sink (a sink writes files and ends its chain);
- neither end opts out: the consumer is not `start_new_chain()`-ed and neither end is
  `disable_chaining()`-ed (Flink's ChainingStrategy HEAD and NEVER);
- the ends are not in two different pipelined groups: chaining them would merge two pipelined
  regions into one that must be deployed as a whole, which the user did not ask for.

A chain is named by its operators joined by "→" (`sales→score→partial`); a chain of one operator
keeps that operator's name. Its kind is SOURCE when the head is a source (even when the tail is a
sink too: such a chain reads splits and commits sink files), SINK when only the tail is a sink,
else OPERATOR. See docs/agent.md, "Chains".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from tailguard.agent.executor.sinks import SinkDef
from tailguard.agent.executor.sources import SourceDef
from tailguard.agent.executor.steps import OperatorStep
from tailguard.agent.graph.api import (
    Chaining,
    InputDef,
    Job,
    JobDefinitionError,
    VertexDef,
    pipelined_groups,
)
from tailguard.model.records import (
    Distribution,
    EdgeSpec,
    Exchange,
    JobGraphSpec,
    VertexKind,
    VertexSpec,
)

# Joins the operator names of a chain into its name; user names cannot contain it.
CHAIN_SEPARATOR = "→"


@dataclass(frozen=True)
class ChainDef:
    """One vertex of the execution graph: a chain of the user's operators, head first.

    The attributes the driver reads have the names of `VertexDef`'s; `inputs` are the head's
    inputs with each producer replaced by the name of the chain that produces it (whose tail
    is that producer).
    """

    name: str
    kind: VertexKind
    inputs: tuple[InputDef, ...]
    # Declared parallelism, the same for every member; None: the decider chooses.
    parallelism: int | None
    # The smallest max parallelism a member declares; None when none declares one.
    max_parallelism: int | None
    # Concurrent attempts are allowed only if every member allows them.
    speculation_safe: bool
    # The head's source, when the chain starts at a source.
    source: SourceDef | None
    # The tail's sink, when the chain ends in a sink.
    sink: SinkDef | None
    # The user's operators in the chain, head first.
    operators: tuple[str, ...]
    # The members' steps, in order (sources and sinks have none).
    steps: tuple[OperatorStep, ...]
    # The largest min parallelism a member declares (every member runs at the chain's
    # parallelism, so each one's lower bound applies); None when none declares one.
    min_parallelism: int | None = None

    @property
    def head(self) -> str:
        return self.operators[0]

    @property
    def tail(self) -> str:
        return self.operators[-1]

    @property
    def join_how(self) -> str | None:
        """The relational join the chain runs (it heads the chain), None if it runs none."""
        head = self.steps[0] if self.steps else None
        return head.join.how if head is not None and head.join is not None else None


@dataclass(frozen=True)
class ChainedJob:
    """A job as it runs: its chains in topological (declaration) order."""

    name: str
    vertices: dict[str, ChainDef]
    # The user's graph it was made from.
    job: Job
    _chain_of: dict[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_operator = {op: c.name for c in self.vertices.values() for op in c.operators}
        object.__setattr__(self, "_chain_of", by_operator)

    def chain_of(self, operator: str) -> str:
        """The name of the chain that runs the user's operator `operator` (KeyError if none)."""
        try:
            return self._chain_of[operator]
        except KeyError:
            raise KeyError(f"no operator {operator!r} in job {self.name!r}") from None

    def spec(self, split_bytes: Mapping[str, tuple[int, ...]] | None = None) -> JobGraphSpec:
        """The graph as submitted in `JobSubmitted`: one `VertexSpec` per chain, with the
        operators it holds, and the edges between chains. `split_bytes` is keyed by chain name
        (the name of the source operator heading the chain is accepted too)."""
        split_bytes = split_bytes or {}
        vertices = tuple(
            VertexSpec(
                name=c.name,
                kind=c.kind,
                parallelism=c.parallelism,
                max_parallelism=c.max_parallelism,
                speculation_safe=c.speculation_safe,
                split_bytes=split_bytes.get(c.name, split_bytes.get(c.head, ())),
                operators=c.operators,
                min_parallelism=c.min_parallelism,
                join=c.join_how,
            )
            for c in self.vertices.values()
        )
        edges = tuple(
            EdgeSpec(
                source=i.producer,
                target=c.name,
                distribution=i.distribution,
                exchange=i.exchange,
                index=index,
            )
            for c in self.vertices.values()
            for index, i in enumerate(c.inputs)
        )
        return JobGraphSpec(vertices=vertices, edges=edges)


def chain(job: Job, *, enabled: bool = True) -> ChainedJob:
    """Cut a valid job into chains. With `enabled=False` (Flink's
    `pipeline.operator-chaining.enabled: false`) every operator is a chain of its own."""
    job.validate()
    for name in job.vertices:
        if CHAIN_SEPARATOR in name:
            raise JobDefinitionError(
                f"vertex name {name!r} contains {CHAIN_SEPARATOR!r}, which names chains"
            )
    consumers: dict[str, int] = dict.fromkeys(job.vertices, 0)
    for v in job.vertices.values():
        for i in v.inputs:
            consumers[i.producer] += 1
    group_of = {name: k for k, group in enumerate(pipelined_groups(job)) for name in group}

    # Declaration order is topological, and a chain is a path: each operator either extends
    # the chain of its only input or starts a new one.
    members: dict[str, list[VertexDef]] = {}
    head_of: dict[str, str] = {}
    for v in job.vertices.values():
        if enabled and len(v.inputs) == 1:
            producer = job.vertices[v.inputs[0].producer]
            if _chainable(producer, v, consumers[producer.name], group_of):
                head_of[v.name] = head_of[producer.name]
                members[head_of[v.name]].append(v)
                continue
        head_of[v.name] = v.name
        members[v.name] = [v]

    chain_name = {operator: _name(members[head]) for operator, head in head_of.items()}
    chains = [_chain_def(m, chain_name) for m in members.values()]
    return ChainedJob(name=job.name, vertices={c.name: c for c in chains}, job=job)


def _chainable(
    producer: VertexDef, consumer: VertexDef, producer_consumers: int, group_of: Mapping[str, int]
) -> bool:
    """Whether `consumer`, whose only input is `producer`, joins `producer`'s chain."""
    (edge,) = consumer.inputs
    return (
        edge.distribution is Distribution.FORWARD
        and edge.exchange is Exchange.BLOCKING
        and producer.parallelism == consumer.parallelism
        and producer_consumers == 1
        and producer.kind is not VertexKind.SINK
        and consumer.chaining is Chaining.ALWAYS
        and producer.chaining is not Chaining.NEVER
        # Ends in two different pipelined groups: chaining would merge their regions.
        and not _in_different_groups(producer.name, consumer.name, group_of)
    )


def _in_different_groups(a: str, b: str, group_of: Mapping[str, int]) -> bool:
    return a in group_of and b in group_of and group_of[a] != group_of[b]


def _name(members: list[VertexDef]) -> str:
    return CHAIN_SEPARATOR.join(m.name for m in members)


def _chain_def(members: list[VertexDef], chain_name: Mapping[str, str]) -> ChainDef:
    head, tail = members[0], members[-1]
    if head.kind is VertexKind.SOURCE:
        kind = VertexKind.SOURCE
    elif tail.kind is VertexKind.SINK:
        kind = VertexKind.SINK
    else:
        kind = VertexKind.OPERATOR
    declared_max = [m.max_parallelism for m in members if m.max_parallelism is not None]
    declared_min = [m.min_parallelism for m in members if m.min_parallelism is not None]
    return ChainDef(
        name=chain_name[head.name],
        kind=kind,
        inputs=tuple(replace(i, producer=chain_name[i.producer]) for i in head.inputs),
        parallelism=head.parallelism,
        max_parallelism=min(declared_max) if declared_max else None,
        speculation_safe=all(m.speculation_safe for m in members),
        source=head.source,
        sink=tail.sink,
        operators=tuple(m.name for m in members),
        steps=tuple(m.step for m in members if m.step is not None),
        min_parallelism=max(declared_min) if declared_min else None,
    )
