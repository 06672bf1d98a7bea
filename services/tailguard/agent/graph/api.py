"""The job-graph API a PySpark user writes against.

    job = Job("sales-by-region")
    sales = job.read_parquet("data/sales")                       # one split per row group
    scored = sales.map_batches(add_revenue)                      # forward, per record batch
    totals = scored.partition_by("region").aggregate(            # hash exchange on "region"
        revenue=("revenue", "sum"), orders=("order_id", "count")
    )
    totals.write_parquet("out/sales_by_region")                  # a sink with the commit protocol
    result = tailguard.run(job, spark)

The operators are shaped like PySpark's (docs/agent.md has the table): `map_batches` (per
record batch), `map_in_arrow` / `map_in_pandas` (an iterator of batches in, an iterator out, as
`mapInArrow` / `mapInPandas`), `filter` / `select` (pyarrow compute expressions), and after
`partition_by(keys)`: `apply_in_pandas` / `apply_in_arrow` (one call per key group, as
`groupBy().applyInPandas`) and `aggregate` (sum, count, min, max, mean). They stream: an attempt
holds a few record batches per operator, not its input. `a.join(b, on=..., how=...)` is PySpark's
relational join (a hash join that streams one side and holds the other up to a bound, spilling
beyond it). `map` / `map_pandas` get the whole input of a subtask as one table or frame (memory
grows with it; for what needs all rows at once), as do `join(b, fn)` and `Job.combine`, whose
function gets one whole table per input. Every vertex is adaptive (the decider chooses its
parallelism from the data) unless given `parallelism=`.

Before it runs, the graph is cut into chains (`tailguard.agent.graph.chaining`): consecutive
operators joined by a FORWARD edge with the same parallelism run in one task, with no result
partition between them. `start_new_chain()` and `disable_chaining()` on a dataset override that
for its vertex, as in Flink.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from tailguard.agent.executor.aggregation import ALL_ROWS, FUNCTIONS, Aggregation
from tailguard.agent.executor.joins import (
    BROADCASTABLE,
    DEFAULT_MEMORY_BYTES,
    JoinSpec,
    default_build,
    join_how,
)
from tailguard.agent.executor.sinks import SinkDef
from tailguard.agent.executor.sources import SourceDef, SourceFormat
from tailguard.agent.executor.steps import OperatorStep, takes_key
from tailguard.model.config import ConfigError, parse_size_bytes
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
    # What an operator does (sources and sinks have none).
    step: OperatorStep | None = None
    parallelism: int | None = None
    max_parallelism: int | None = None
    # A lower bound for the decider (Flink 2.1's per-vertex min parallelism); None: the job's
    # `execution.batch.adaptive.auto-parallelism.min-parallelism` applies.
    min_parallelism: int | None = None
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
        """A vertex reading several inputs; `fn` gets one whole table per input, in order (the
        subtask's whole inputs are held in memory; `Dataset.join(other, on=, how=)` streams)."""
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
        return self._step(
            inputs, OperatorStep("", fn, "pandas" if pandas else "arrow"), name, options
        )

    def _step(
        self,
        inputs: list[InputDef],
        step: OperatorStep,
        name: str | None,
        options: dict[str, Any],
    ) -> Dataset:
        """Add an operator vertex running `step` (whose name is filled in here)."""
        base = getattr(step.fn, "__name__", None) or step.style
        vertex = self._add(
            VertexDef(
                name=name or self._fresh(base),
                kind=VertexKind.OPERATOR,
                inputs=inputs,
                **_vertex_options(options),
            )
        )
        vertex.step = replace(step, name=vertex.name)
        return Dataset(self, vertex.name)

    def _add(self, vertex: VertexDef) -> VertexDef:
        if not _NAME.match(vertex.name) or vertex.name.startswith("@"):
            raise JobDefinitionError(
                f"vertex name {vertex.name!r}: use only letters, digits, '_', '.', '-'"
            )
        if vertex.name in self.vertices:
            raise JobDefinitionError(f"duplicate vertex name {vertex.name!r}")
        for option in ("parallelism", "max_parallelism", "min_parallelism"):
            _check_positive(vertex.name, option, getattr(vertex, option))
        _check_bounds(vertex)
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


def _check_positive(vertex: str, option: str, value: object) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise JobDefinitionError(f"{vertex}: {option} must be a positive integer, got {value!r}")


def _check_bounds(vertex: VertexDef) -> None:
    """min ≤ max, and a fixed parallelism within both: a contradiction in one vertex's own
    options is the user's mistake, named here rather than resolved silently by the decider."""
    low, high, fixed = vertex.min_parallelism, vertex.max_parallelism, vertex.parallelism
    if low is not None and high is not None and low > high:
        raise JobDefinitionError(
            f"{vertex.name}: min_parallelism {low} is above max_parallelism {high}"
        )
    if fixed is not None and low is not None and fixed < low:
        raise JobDefinitionError(
            f"{vertex.name}: parallelism {fixed} is below its min_parallelism {low}"
        )
    if fixed is not None and high is not None and fixed > high:
        # Flink refuses the same ("the parallelism must be at most the max parallelism").
        raise JobDefinitionError(
            f"{vertex.name}: parallelism {fixed} is above its max_parallelism {high}"
        )


def _vertex_options(options: dict[str, Any]) -> dict[str, Any]:
    allowed = {"parallelism", "max_parallelism", "min_parallelism", "speculation_safe"}
    unknown = set(options) - allowed
    if unknown:
        raise JobDefinitionError(
            f"unknown vertex option(s) {sorted(unknown)}; allowed: {sorted(allowed)}"
        )
    return options


class _Operators:
    """The operators, read through the edge `_edge()` gives: FORWARD from a `Dataset`, the
    chosen exchange from an `Exchanged`."""

    def _edge(self) -> Exchanged:
        raise NotImplementedError

    def _add_step(self, step: OperatorStep, name: str | None, options: dict[str, Any]) -> Dataset:
        edge = self._edge()
        return edge.dataset.job._step([edge.input_def()], step, name, options)

    # ------------------------------------------------------------ streamed, per batch

    # ------------------------------------------------------------ two inputs

    def join(
        self,
        other: Dataset | Exchanged,
        on: str | Sequence[str] | Callable[..., Any] | None = None,
        how: str | None = None,
        *,
        fn: Callable[..., Any] | None = None,
        memory: int | str | None = None,
        name: str | None = None,
        pandas: bool = False,
        **options: Any,
    ) -> Dataset:
        """PySpark's `df.join(other, on, how)`: rows of both sides whose `on` columns are equal,
        `how` one of inner (the default), left, right, full, semi, anti (or PySpark's spellings:
        outer, left_outer, leftsemi, ...). A null key never matches, as in Spark. The output
        has the keys once, then this side's other columns, then `other`'s.

        Both sides are hash-partitioned on `on` (a plain dataset gets `partition_by(*on)`),
        unless one side is `broadcast()`, when the other is read as it is, with no shuffle.
        Each subtask holds its build side (the right one; the left one for a right join; a
        broadcast side) in memory up to `memory` bytes (an int or a size such as "256 MiB";
        default 64 MiB) and spills beyond it; the other side streams.

        `join(other, fn)` (or `fn=`) instead calls fn(this_table, other_table) per subtask
        with both whole inputs (`pandas=True`: frames), as `Job.combine` does."""
        edge = self._edge()
        if callable(on) or fn is not None:
            function = on if callable(on) else fn
            if how is not None or (callable(on) and fn is not None) or memory is not None:
                raise JobDefinitionError(
                    "join(other, fn) takes a function of both whole inputs; give either a "
                    "function or on=/how=/memory=, not both"
                )
            assert function is not None
            job = edge.dataset.job
            return job.combine([edge, other], function, name=name, pandas=pandas, **options)
        if pandas:
            raise JobDefinitionError("join: pandas=True applies to join(other, fn) only")
        left, right, spec = _join_inputs(edge, _as_exchanged(other), on, how, memory)
        step = OperatorStep("", None, "join", join=spec)
        return edge.dataset.job._step([left, right], step, name, options)

    # ------------------------------------------------------------ streamed, per batch

    def map_batches(
        self, fn: Callable[..., Any], *, name: str | None = None, **options: Any
    ) -> Dataset:
        """fn(pyarrow.RecordBatch) -> RecordBatch, Table or pandas.DataFrame, once per record
        batch (the batch size is `python.fn-execution.arrow.batch.size` rows). A subtask with
        no rows calls it once with an empty batch, so its result still has columns."""
        return self._add_step(
            OperatorStep("", _callable(fn, "map_batches"), "map_batches"), name, options
        )

    def map_in_arrow(
        self,
        fn: Callable[..., Any],
        schema: pa.Schema | None = None,
        *,
        name: str | None = None,
        **options: Any,
    ) -> Dataset:
        """fn(Iterator[pyarrow.RecordBatch]) -> Iterator[pyarrow.RecordBatch], once per subtask,
        as PySpark's `mapInArrow`. `schema`, if given, is the output's (columns taken by name
        and cast to it); it also types the output of a subtask that yields nothing."""
        step = OperatorStep(
            "", _callable(fn, "map_in_arrow"), "map_in_arrow", schema=_schema(schema)
        )
        return self._add_step(step, name, options)

    def map_in_pandas(
        self,
        fn: Callable[..., Any],
        schema: pa.Schema | None = None,
        *,
        name: str | None = None,
        **options: Any,
    ) -> Dataset:
        """fn(Iterator[pandas.DataFrame]) -> Iterator[pandas.DataFrame], once per subtask: the
        same function object PySpark's `df.mapInPandas(fn, schema)` takes. `schema` as for
        `map_in_arrow` (a `pyarrow.Schema`)."""
        step = OperatorStep(
            "", _callable(fn, "map_in_pandas"), "map_in_pandas", schema=_schema(schema)
        )
        return self._add_step(step, name, options)

    def filter(
        self, predicate: pc.Expression, *, name: str | None = None, **options: Any
    ) -> Dataset:
        """The rows for which `predicate`, a `pyarrow.compute` expression such as
        `pc.field("amount") > 0`, is true (null counts as false, as in Spark)."""
        if not isinstance(predicate, pc.Expression):
            raise JobDefinitionError(
                f"filter takes a pyarrow.compute expression such as pc.field('amount') > 0, got "
                f"{type(predicate).__name__}; for a Python predicate use map_batches"
            )
        return self._add_step(OperatorStep("", None, "filter", predicate=predicate), name, options)

    def select(
        self,
        *columns: str | tuple[str, pc.Expression] | Mapping[str, pc.Expression],
        name: str | None = None,
        **options: Any,
    ) -> Dataset:
        """The given columns, in order: a name keeps a column, `(name, expression)` or a
        mapping `{name: expression}` computes one with `pyarrow.compute`, such as
        `("revenue", pc.field("quantity") * pc.field("price_cents"))`."""
        projections = _projections(columns)
        return self._add_step(
            OperatorStep("", None, "select", projections=projections), name, options
        )

    # ------------------------------------------------------------ whole input

    def map(self, fn: Callable[..., Any], *, name: str | None = None, **options: Any) -> Dataset:
        """fn(pyarrow.Table) -> Table, RecordBatch or pandas.DataFrame, once per subtask with
        its whole input: memory grows with the input. For what needs every row at once (a
        sort, a global dedup); otherwise map_batches or map_in_arrow stream."""
        return self._add_step(OperatorStep("", _callable(fn, "map"), "arrow"), name, options)

    def map_pandas(
        self, fn: Callable[..., Any], *, name: str | None = None, **options: Any
    ) -> Dataset:
        """fn(pandas.DataFrame) -> DataFrame or pyarrow.Table, once per subtask with its whole
        input, as `map`; map_in_pandas streams."""
        return self._add_step(
            OperatorStep("", _callable(fn, "map_pandas"), "pandas"), name, options
        )

    def write_parquet(self, path: str, *, name: str | None = None, **options: Any) -> Dataset:
        """A Parquet sink; only the winning attempt of each subtask is committed."""
        edge = self._edge()
        job = edge.dataset.job
        vertex = job._add(
            VertexDef(
                name=name or job._fresh("write_parquet"),
                kind=VertexKind.SINK,
                inputs=[edge.input_def()],
                sink=SinkDef("parquet", str(path)),
                **_vertex_options(options),
            )
        )
        return Dataset(job, vertex.name)


@dataclass(frozen=True)
class Exchanged(_Operators):
    """A dataset together with the way its consumer will read it."""

    dataset: Dataset
    distribution: Distribution
    keys: tuple[str, ...] = ()
    exchange: Exchange = Exchange.BLOCKING

    def _edge(self) -> Exchanged:
        return self

    def input_def(self) -> InputDef:
        return InputDef(self.dataset.name, self.distribution, self.keys, self.exchange)

    def pipelined(self) -> Exchanged:
        """Make this edge PIPELINED: producer and consumer form one pipelined region that is
        scheduled as a whole (FLIP-119). Both ends need a fixed parallelism."""
        return Exchanged(self.dataset, self.distribution, self.keys, Exchange.PIPELINED)

    # ------------------------------------------------------------ per key group

    def apply_in_pandas(
        self,
        fn: Callable[..., Any],
        schema: pa.Schema | None = None,
        *,
        name: str | None = None,
        **options: Any,
    ) -> Dataset:
        """fn(pandas.DataFrame) -> DataFrame, or fn(key, DataFrame) with the key values as a
        tuple, once per key group of `partition_by(keys)`: PySpark's
        `groupBy(keys).applyInPandas(fn, schema)`. A group must fit in memory; the subtask's
        input need not (groups are assembled through local spill files)."""
        return self._group_step(fn, "apply_in_pandas", schema, name, options)

    def apply_in_arrow(
        self,
        fn: Callable[..., Any],
        schema: pa.Schema | None = None,
        *,
        name: str | None = None,
        **options: Any,
    ) -> Dataset:
        """fn(pyarrow.Table) -> Table, or fn(key, Table), once per key group, as
        `apply_in_pandas` (PySpark's `applyInArrow`)."""
        return self._group_step(fn, "apply_in_arrow", schema, name, options)

    def aggregate(
        self,
        aggregations: Mapping[str, tuple[str, str]] | None = None,
        *,
        name: str | None = None,
        **named: Any,
    ) -> Dataset:
        """One row per key of `partition_by(keys)`: the keys, then one column per aggregation,
        `output=(column, function)` with function sum, count, min, max or mean (column "*"
        with count counts rows), as `groupBy(keys).agg(...)`. Computed per batch and combined,
        with no user function; sorted by key. Outputs whose names are taken by `name=` or a
        vertex option go in the `aggregations` mapping."""
        keys = self._group_keys("aggregate")
        options = {k: v for k, v in named.items() if not isinstance(v, tuple)}
        specs = {**(aggregations or {}), **{k: v for k, v in named.items() if isinstance(v, tuple)}}
        step = OperatorStep(
            "", None, "aggregate", keys=keys, aggregations=_aggregations(specs, keys)
        )
        return self._add_step(step, name, options)

    def _group_keys(self, call: str) -> tuple[str, ...]:
        if self.distribution is not Distribution.ALL_TO_ALL or not self.keys:
            raise JobDefinitionError(
                f"{call} works per key group: call it after partition_by(keys), which sends every "
                f"row of a key to one subtask"
            )
        return self.keys

    def _group_step(
        self,
        fn: Callable[..., Any],
        style: Literal["apply_in_pandas", "apply_in_arrow"],
        schema: pa.Schema | None,
        name: str | None,
        options: dict[str, Any],
    ) -> Dataset:
        keys = self._group_keys(style)
        try:
            takes_key(_callable(fn, style))
        except ValueError as err:
            raise JobDefinitionError(f"{style}: {err}") from None
        step = OperatorStep("", fn, style, keys=keys, schema=_schema(schema))
        return self._add_step(step, name, options)


@dataclass(frozen=True)
class Dataset(_Operators):
    """The output of one vertex. Reading it without an exchange is FORWARD."""

    job: Job
    name: str

    def _edge(self) -> Exchanged:
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

    def rescale(self) -> Exchanged:
        """Round-robin to a subset of the consumers (POINTWISE, Flink's `rescale`): each
        consumer subtask reads a byte-balanced run of the producer's (partition, subpartition)
        slices, so the consumer's parallelism is free of the producer's, with no all-to-all
        exchange."""
        return Exchanged(self, Distribution.POINTWISE)

    def broadcast(self) -> Exchanged:
        """Every consumer subtask reads all of it (the small side of a join)."""
        return Exchanged(self, Distribution.BROADCAST)

    def pipelined(self) -> Exchanged:
        return self._edge().pipelined()

    # vertex options, Spark-style chaining on the vertex just built
    def _vertex(self) -> VertexDef:
        return self.job.vertices[self.name]

    def with_parallelism(self, parallelism: int) -> Dataset:
        return self._bound("parallelism", parallelism)

    def with_max_parallelism(self, max_parallelism: int) -> Dataset:
        return self._bound("max_parallelism", max_parallelism)

    def with_min_parallelism(self, min_parallelism: int) -> Dataset:
        """The decider gives this vertex at least `min_parallelism` subtasks, as far as its
        inputs can feed them (Flink 2.1's per-vertex min parallelism)."""
        return self._bound("min_parallelism", min_parallelism)

    def _bound(
        self, option: Literal["parallelism", "max_parallelism", "min_parallelism"], value: int
    ) -> Dataset:
        vertex = self._vertex()
        _check_positive(self.name, option, value)
        before = getattr(vertex, option)
        setattr(vertex, option, value)
        try:
            _check_bounds(vertex)
        except JobDefinitionError:
            setattr(vertex, option, before)
            raise
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


def _callable(fn: Any, call: str) -> Callable[..., Any]:
    if not callable(fn):
        raise JobDefinitionError(f"{call}: the operator function must be callable, got {fn!r}")
    return fn  # type: ignore[no-any-return]


def _schema(schema: Any) -> pa.Schema | None:
    if schema is None or isinstance(schema, pa.Schema):
        return schema
    raise JobDefinitionError(
        f"schema must be a pyarrow.Schema (e.g. pa.schema([('id', pa.int64())])), got "
        f"{type(schema).__name__}"
    )


def _projections(
    columns: Sequence[str | tuple[str, pc.Expression] | Mapping[str, pc.Expression]],
) -> tuple[tuple[str, pc.Expression], ...]:
    if not columns:
        raise JobDefinitionError("select needs at least one column")
    projections: list[tuple[str, pc.Expression]] = []
    for column in columns:
        if isinstance(column, str):
            projections.append((column, pc.field(column)))
        elif isinstance(column, Mapping):
            projections.extend(column.items())
        elif isinstance(column, tuple) and len(column) == 2 and isinstance(column[0], str):
            projections.append(column)
        else:
            raise JobDefinitionError(
                f"select takes column names, (name, expression) pairs or {{name: expression}} "
                f"mappings, got {column!r}"
            )
    for output, expression in projections:
        if not isinstance(expression, pc.Expression):
            raise JobDefinitionError(
                f"select: {output!r} must be a pyarrow.compute expression, got "
                f"{type(expression).__name__}"
            )
    names = [output for output, _ in projections]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise JobDefinitionError(f"select: output column(s) {duplicates} named more than once")
    return tuple(projections)


def _aggregations(specs: Mapping[str, Any], keys: tuple[str, ...]) -> tuple[Aggregation, ...]:
    if not specs:
        raise JobDefinitionError(
            "aggregate needs at least one aggregation, e.g. total=('amount', 'sum')"
        )
    result: list[Aggregation] = []
    for output, spec in specs.items():
        if output in keys:
            raise JobDefinitionError(f"aggregate: output {output!r} is also a key column")
        if (
            not isinstance(spec, tuple)
            or len(spec) != 2
            or not all(isinstance(part, str) for part in spec)
        ):
            raise JobDefinitionError(
                f"aggregate: {output}= must be a (column, function) pair, got {spec!r}"
            )
        column, function = spec
        if function not in FUNCTIONS:
            raise JobDefinitionError(
                f"aggregate: {output}=({column!r}, {function!r}): unknown function; use one of "
                f"{', '.join(FUNCTIONS)}"
            )
        if column == ALL_ROWS and function != "count":
            raise JobDefinitionError(f"aggregate: {output}: column '*' works only with count")
        result.append(Aggregation(output, column, function))
    return tuple(result)


def _join_inputs(
    left: Exchanged,
    right: Exchanged,
    on: str | Sequence[str] | None,
    how: str | None,
    memory: int | str | None,
) -> tuple[InputDef, InputDef, JoinSpec]:
    """Both sides' edges and the join's specification, checked: co-partitioned on `on`
    (a plain dataset gets the exchange), or one side broadcast where the join type allows it."""
    if left.dataset.job is not right.dataset.job:
        raise JobDefinitionError("join: both sides must belong to one job")
    keys = _join_keys(on)
    try:
        kind = join_how("inner" if how is None else how)
    except ValueError as err:
        raise JobDefinitionError(str(err)) from None
    sides = {"left": left, "right": right}
    broadcast = [s for s, e in sides.items() if e.distribution is Distribution.BROADCAST]
    if len(broadcast) == 2:
        raise JobDefinitionError("join: broadcast one side at most")
    if broadcast:
        (build,) = broadcast
        if build not in BROADCASTABLE[kind]:
            allowed = " or ".join(sorted(BROADCASTABLE[kind])) or "neither side"
            raise JobDefinitionError(
                f"join how={kind!r}: its {build} side cannot be broadcast, since every subtask "
                f"would emit that side's unmatched rows; for a {kind} join broadcast {allowed}"
            )
        defs = [e.input_def() for e in sides.values()]
    else:
        build = default_build(kind)
        defs = [_co_partitioned(s, e, keys) for s, e in sides.items()]
    try:
        spec = JoinSpec(keys, kind, "left" if build == "left" else "right", _memory_bytes(memory))
    except ValueError as err:
        raise JobDefinitionError(f"join: {err}") from None
    return defs[0], defs[1], spec


def _join_keys(on: str | Sequence[str] | None) -> tuple[str, ...]:
    keys = (on,) if isinstance(on, str) else tuple(on) if on is not None else ()
    if not keys or not all(isinstance(k, str) and k for k in keys):
        raise JobDefinitionError(
            f"join: on= names the key column(s), e.g. on='customer_id' or on=['a', 'b'], got "
            f"{on!r} (a join condition as an expression is not supported)"
        )
    if len(set(keys)) != len(keys):
        raise JobDefinitionError(f"join: on={list(keys)} names a column twice")
    return keys


def _co_partitioned(side: str, edge: Exchanged, keys: tuple[str, ...]) -> InputDef:
    """The side's edge, hash-partitioned on the join keys."""
    if edge.distribution is Distribution.FORWARD:
        return InputDef(edge.dataset.name, Distribution.ALL_TO_ALL, keys, edge.exchange)
    if edge.distribution is Distribution.ALL_TO_ALL and edge.keys == keys:
        return edge.input_def()
    if edge.keys:
        given = f"partition_by({', '.join(map(repr, edge.keys))})"
    else:
        given = "rescale()" if edge.distribution is Distribution.POINTWISE else "rebalance()"
    raise JobDefinitionError(
        f"join on {list(keys)}: the {side} side is read through {given}; partition both sides "
        f"by the join keys in order (or pass the dataset itself), or broadcast one side"
    )


def _memory_bytes(memory: int | str | None) -> int:
    if memory is None:
        return DEFAULT_MEMORY_BYTES
    if isinstance(memory, str):
        try:
            return parse_size_bytes(memory)
        except ConfigError as err:
            raise JobDefinitionError(f"join memory={memory!r}: {err}") from None
    if isinstance(memory, bool) or not isinstance(memory, int):
        raise JobDefinitionError(f"join memory= is a number of bytes or a size, got {memory!r}")
    return memory


def _as_exchanged(value: Dataset | Exchanged) -> Exchanged:
    if isinstance(value, Dataset):
        return Exchanged(value, Distribution.FORWARD)
    if isinstance(value, Exchanged):
        return value
    raise JobDefinitionError(f"expected a Dataset or an exchange of one, got {value!r}")
