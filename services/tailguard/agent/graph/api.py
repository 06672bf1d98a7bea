"""The job-graph API a PySpark user writes against.

    job = Job("sales-by-region")
    sales = job.read_parquet("data/sales")                     # a source: one split per row group
    partial = sales.map(partial_sums)                          # forward: same parallelism
    totals = partial.partition_by("region").map(final_sums)    # hash exchange on "region"
    totals.write_parquet("out/sales_by_region")                # a sink with the commit protocol
    result = tailguard.run(job, spark)

Operators take and return Arrow tables (`map`) or pandas frames (`map_pandas`); either kind of
result is accepted and converted. A vertex with several inputs (a join) is built with `join` or
`Job.combine`. Every vertex is adaptive (the decider chooses its parallelism from the data) unless
given `parallelism=`.

Before it runs, the graph is cut into chains (`tailguard.agent.graph.chaining`): consecutive
operators joined by a FORWARD edge with the same parallelism run in one task, with no result
partition between them. `start_new_chain()` and `disable_chaining()` on a dataset override that
for its vertex, as in Flink.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from tailguard.agent.executor.sinks import SinkDef
from tailguard.agent.executor.sources import SourceDef, SourceFormat
from tailguard.model.records import (
    Distribution,
    Exchange,
    VertexKind,
)

_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class JobDefinitionError(ValueError):
    """The job graph is not valid; the message says what and where."""


class Chaining(enum.Enum):
    """Whether a vertex may share a chain with its neighbours (Flink's ChainingStrategy)."""

    # Chained with its input and its consumer wherever the chaining rules allow.
    ALWAYS = "always"
    # Heads a chain: never chained to its input, but its consumer may join it (start_new_chain).
    HEAD = "head"
    # A chain of its own (disable_chaining).
    NEVER = "never"


@dataclass
class InputDef:
    """One input of a vertex: the producer and how its records are distributed."""

    producer: str
    distribution: Distribution
    keys: tuple[str, ...] = ()
    exchange: Exchange = Exchange.BLOCKING


@dataclass
class VertexDef:
    name: str
    kind: VertexKind
    inputs: list[InputDef] = field(default_factory=list)
    fn: Callable[..., Any] | None = None
    # "arrow": fn gets pyarrow Tables; "pandas": fn gets pandas DataFrames.
    style: Literal["arrow", "pandas"] = "arrow"
    parallelism: int | None = None
    max_parallelism: int | None = None
    speculation_safe: bool = True
    source: SourceDef | None = None
    sink: SinkDef | None = None
    chaining: Chaining = Chaining.ALWAYS


class Job:
    """A batch job graph under construction."""

    def __init__(self, name: str) -> None:
        if not name or not _NAME.match(name):
            raise JobDefinitionError(
                f"job name {name!r} must be non-empty and use only letters, digits, '_', '.', '-'"
            )
        self.name = name
        self.vertices: dict[str, VertexDef] = {}

    # ----------------------------------------------------------------- sources

    def read_parquet(self, *paths: str, name: str | None = None, **options: Any) -> Dataset:
        """Parquet files or directories; one split per row group."""
        return self._source("parquet", paths, name, options)

    def read_csv(self, *paths: str, name: str | None = None, **options: Any) -> Dataset:
        """CSV files or directories; one split per file. `options` go to pyarrow.csv."""
        return self._source("csv", paths, name, options)

    def read_json(self, *paths: str, name: str | None = None, **options: Any) -> Dataset:
        """JSON-lines files or directories; one split per file."""
        return self._source("json", paths, name, options)

    def _source(
        self,
        fmt: SourceFormat,
        paths: Sequence[str],
        name: str | None,
        options: dict[str, Any],
    ) -> Dataset:
        if not paths:
            raise JobDefinitionError(f"read_{fmt} needs at least one path")
        parallelism = options.pop("parallelism", None)
        vertex = self._add(
            VertexDef(
                name=name or self._fresh(f"read_{fmt}"),
                kind=VertexKind.SOURCE,
                source=SourceDef(fmt, tuple(str(p) for p in paths), options),
                parallelism=parallelism,
            )
        )
        return Dataset(self, vertex.name)

    # ----------------------------------------------------------------- many inputs

    def combine(
        self,
        inputs: Sequence[Dataset | Exchanged],
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        pandas: bool = False,
        **vertex_options: Any,
    ) -> Dataset:
        """A vertex reading several inputs; `fn` gets one table per input, in order."""
        if not inputs:
            raise JobDefinitionError("combine needs at least one input")
        defs = [_as_exchanged(i).input_def() for i in inputs]
        for i in inputs:
            if _as_exchanged(i).dataset.job is not self:
                raise JobDefinitionError("combine: every input must belong to this job")
        return self._operator(defs, fn, name, pandas, vertex_options)

    # ----------------------------------------------------------------- internals

    def _operator(
        self,
        inputs: list[InputDef],
        fn: Callable[..., Any],
        name: str | None,
        pandas: bool,
        options: dict[str, Any],
    ) -> Dataset:
        if not callable(fn):
            raise JobDefinitionError(f"operator function must be callable, got {fn!r}")
        vertex = self._add(
            VertexDef(
                name=name or self._fresh(getattr(fn, "__name__", "op")),
                kind=VertexKind.OPERATOR,
                inputs=inputs,
                fn=fn,
                style="pandas" if pandas else "arrow",
                **_vertex_options(options),
            )
        )
        return Dataset(self, vertex.name)

    def _add(self, vertex: VertexDef) -> VertexDef:
        if not _NAME.match(vertex.name) or vertex.name.startswith("@"):
            raise JobDefinitionError(
                f"vertex name {vertex.name!r}: use only letters, digits, '_', '.', '-'"
            )
        if vertex.name in self.vertices:
            raise JobDefinitionError(f"duplicate vertex name {vertex.name!r}")
        for option in ("parallelism", "max_parallelism"):
            value = getattr(vertex, option)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise JobDefinitionError(f"{vertex.name}: {option} must be a positive integer")
        self.vertices[vertex.name] = vertex
        return vertex

    def _fresh(self, base: str) -> str:
        base = re.sub(r"[^A-Za-z0-9_.-]", "_", base).strip("_") or "op"
        if base not in self.vertices:
            return base
        n = 2
        while f"{base}_{n}" in self.vertices:
            n += 1
        return f"{base}_{n}"

    # ----------------------------------------------------------------- validation

    def validate(self) -> None:
        if not self.vertices:
            raise JobDefinitionError(f"job {self.name!r} has no vertices")
        consumed = {i.producer for v in self.vertices.values() for i in v.inputs}
        for v in self.vertices.values():
            if v.kind is not VertexKind.SINK and v.name not in consumed:
                raise JobDefinitionError(
                    f"vertex {v.name!r} has no consumer: end the branch with write_parquet()"
                )
        if not any(v.kind is VertexKind.SINK for v in self.vertices.values()):
            raise JobDefinitionError(f"job {self.name!r} has no sink")
        self._validate_pipelined()

    def _validate_pipelined(self) -> None:
        for v in self.vertices.values():
            for i in v.inputs:
                if i.exchange is not Exchange.PIPELINED:
                    continue
                # Adaptive parallelism is decided from finished inputs (FLIP-187), which a
                # consumer deployed together with its producer cannot wait for.
                for end in (i.producer, v.name):
                    if self.vertices[end].parallelism is None:
                        raise JobDefinitionError(
                            f"pipelined edge {i.producer} -> {v.name}: {end!r} needs a fixed "
                            f"parallelism (parallelism=...) because a pipelined consumer starts "
                            f"before its producer's output size is known"
                        )
        # A path through a blocking edge from one member of a pipelined group to another would
        # make its regions wait on each other's finished output: they could never be scheduled.
        group_of = {name: k for k, group in enumerate(pipelined_groups(self)) for name in group}
        if not group_of:
            return
        reach = _descendants(self)
        for v in self.vertices.values():
            for i in v.inputs:
                if i.exchange is Exchange.PIPELINED:
                    continue
                before = {group_of[a] for a in group_of if i.producer in reach[a] | {a}}
                after = {group_of[d] for d in reach[v.name] | {v.name} if d in group_of}
                if before & after:
                    raise JobDefinitionError(
                        f"blocking edge {i.producer} -> {v.name} lies on a path between vertices "
                        f"joined by pipelined edges; make that path pipelined too, or none of it"
                    )


class EdgeEnd(Protocol):
    """What graph utilities read of an input: `InputDef`, and the chains' inputs alike."""

    @property
    def producer(self) -> str: ...

    @property
    def exchange(self) -> Exchange: ...


class GraphVertex(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def inputs(self) -> Sequence[EdgeEnd]: ...


class Graph(Protocol):
    """A graph of named vertices in topological order: a `Job` (operators) or a `ChainedJob`
    (chains)."""

    @property
    def vertices(self) -> Mapping[str, GraphVertex]: ...


def pipelined_groups(job: Graph) -> list[tuple[str, ...]]:
    """Vertices joined by PIPELINED edges (connected components with at least two vertices),
    each in the graph's declaration order (which is topological: inputs exist before use).
    Works on operators (`Job`) and on chains (`ChainedJob`)."""
    parent = {name: name for name in job.vertices}

    def find(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    for v in job.vertices.values():
        for i in v.inputs:
            if i.exchange is Exchange.PIPELINED:
                parent[find(v.name)] = find(i.producer)
    groups: dict[str, list[str]] = {}
    for name in job.vertices:
        groups.setdefault(find(name), []).append(name)
    return [tuple(g) for g in groups.values() if len(g) > 1]


def _descendants(job: Graph) -> dict[str, set[str]]:
    """Every vertex reachable from each vertex (job graphs are small)."""
    consumers: dict[str, list[str]] = {name: [] for name in job.vertices}
    for v in job.vertices.values():
        for i in v.inputs:
            consumers[i.producer].append(v.name)
    reach: dict[str, set[str]] = {}
    for name in reversed(list(job.vertices)):  # consumers are declared after their producers
        reach[name] = set()
        for c in consumers[name]:
            reach[name] |= {c} | reach[c]
    return reach


def _vertex_options(options: dict[str, Any]) -> dict[str, Any]:
    allowed = {"parallelism", "max_parallelism", "speculation_safe"}
    unknown = set(options) - allowed
    if unknown:
        raise JobDefinitionError(
            f"unknown vertex option(s) {sorted(unknown)}; allowed: {sorted(allowed)}"
        )
    return options


@dataclass(frozen=True)
class Exchanged:
    """A dataset together with the way its consumer will read it."""

    dataset: Dataset
    distribution: Distribution
    keys: tuple[str, ...] = ()
    exchange: Exchange = Exchange.BLOCKING

    def input_def(self) -> InputDef:
        return InputDef(self.dataset.name, self.distribution, self.keys, self.exchange)

    def pipelined(self) -> Exchanged:
        """Make this edge PIPELINED: producer and consumer form one pipelined region that is
        scheduled as a whole (FLIP-119). Both ends need a fixed parallelism."""
        return Exchanged(self.dataset, self.distribution, self.keys, Exchange.PIPELINED)

    def map(self, fn: Callable[..., Any], *, name: str | None = None, **options: Any) -> Dataset:
        return self.dataset.job._operator([self.input_def()], fn, name, False, options)

    def map_pandas(
        self, fn: Callable[..., Any], *, name: str | None = None, **options: Any
    ) -> Dataset:
        return self.dataset.job._operator([self.input_def()], fn, name, True, options)

    def write_parquet(self, path: str, *, name: str | None = None, **options: Any) -> Dataset:
        job = self.dataset.job
        vertex = job._add(
            VertexDef(
                name=name or job._fresh("write_parquet"),
                kind=VertexKind.SINK,
                inputs=[self.input_def()],
                sink=SinkDef("parquet", str(path)),
                **_vertex_options(options),
            )
        )
        return Dataset(job, vertex.name)


@dataclass(frozen=True)
class Dataset:
    """The output of one vertex. Reading it without an exchange is FORWARD."""

    job: Job
    name: str

    def _forward(self) -> Exchanged:
        return Exchanged(self, Distribution.FORWARD)

    # exchanges
    def partition_by(self, *keys: str) -> Exchanged:
        """Hash-partition by `keys` (ALL_TO_ALL): equal keys meet in one subtask."""
        if not keys:
            raise JobDefinitionError("partition_by needs at least one key column")
        return Exchanged(self, Distribution.ALL_TO_ALL, tuple(keys))

    def rebalance(self) -> Exchanged:
        """Round-robin redistribution (ALL_TO_ALL) to even out sizes."""
        return Exchanged(self, Distribution.ALL_TO_ALL)

    def broadcast(self) -> Exchanged:
        """Every consumer subtask reads all of it (the small side of a join)."""
        return Exchanged(self, Distribution.BROADCAST)

    def pipelined(self) -> Exchanged:
        return self._forward().pipelined()

    # operators
    def map(self, fn: Callable[..., Any], *, name: str | None = None, **options: Any) -> Dataset:
        """fn(pyarrow.Table) -> pyarrow.Table or pandas.DataFrame, per subtask."""
        return self._forward().map(fn, name=name, **options)

    def map_pandas(
        self, fn: Callable[..., Any], *, name: str | None = None, **options: Any
    ) -> Dataset:
        """fn(pandas.DataFrame) -> pandas.DataFrame or pyarrow.Table, per subtask."""
        return self._forward().map_pandas(fn, name=name, **options)

    def join(
        self,
        other: Dataset | Exchanged,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        pandas: bool = False,
        **options: Any,
    ) -> Dataset:
        """fn(this_table, other_table) per subtask. Co-partition both sides with
        partition_by on the join keys, or broadcast the small side."""
        return self.job.combine([self, other], fn, name=name, pandas=pandas, **options)

    def write_parquet(self, path: str, *, name: str | None = None, **options: Any) -> Dataset:
        """A Parquet sink; only the winning attempt of each subtask is committed."""
        return self._forward().write_parquet(path, name=name, **options)

    # vertex options, Spark-style chaining on the vertex just built
    def _vertex(self) -> VertexDef:
        return self.job.vertices[self.name]

    def with_parallelism(self, parallelism: int) -> Dataset:
        if not isinstance(parallelism, int) or parallelism < 1:
            raise JobDefinitionError(f"{self.name}: parallelism must be a positive integer")
        self._vertex().parallelism = parallelism
        return self

    def with_max_parallelism(self, max_parallelism: int) -> Dataset:
        if not isinstance(max_parallelism, int) or max_parallelism < 1:
            raise JobDefinitionError(f"{self.name}: max_parallelism must be a positive integer")
        self._vertex().max_parallelism = max_parallelism
        return self

    def speculation_unsafe(self) -> Dataset:
        """This vertex has side effects outside its sink: never run two attempts at once."""
        self._vertex().speculation_safe = False
        return self

    def start_new_chain(self) -> Dataset:
        """Begin a new chain at this vertex: it is not chained to its input, though its own
        consumer may still be chained to it (Flink's startNewChain)."""
        self._vertex().chaining = Chaining.HEAD
        return self

    def disable_chaining(self) -> Dataset:
        """Run this vertex as a chain of its own: chained neither to its input nor to its
        consumer (Flink's disableChaining). Its output is then always a result partition."""
        self._vertex().chaining = Chaining.NEVER
        return self


def _as_exchanged(value: Dataset | Exchanged) -> Exchanged:
    if isinstance(value, Dataset):
        return Exchanged(value, Distribution.FORWARD)
    if isinstance(value, Exchanged):
        return value
    raise JobDefinitionError(f"expected a Dataset or an exchange of one, got {value!r}")
