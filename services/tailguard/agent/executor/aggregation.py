"""Built-in aggregation per key (`partition_by(keys).aggregate(...)`), computed per batch and
combined, so the common aggregation needs no user function and holds one row per key.

Each batch is reduced to a partial state per key with pyarrow's hash aggregation; states are
merged whenever they pile up past one batch of rows, and once more at the end: sums and counts
add up, minima and maxima take their own extreme, a mean is kept as its sum and count and
divided last (Spark's `avg` does the same). Results come out sorted by key (nulls last), so the
same input always gives the same partition.

**Two phases** (`LocalPhase`; Flink's `table.optimizer.agg-phase-strategy`, Spark's partial
aggregation before its exchange): when every consumer of a producer's output is such an
aggregation, the producer writes partial states instead of rows (`partial_states`), and the
consumer merges them (`aggregate_batches(..., merging=True)`). A hot key then crosses the
exchange as one state row per producer flush, not as its rows: the skew an aggregation
suffers from a heavy key is gone before the decider sees the sizes (agent/driver/
local_aggregation.py says why this, not a split, serves `partition_by().aggregate`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc

from tailguard.agent.executor.batches import as_batches

AggregateFunction = Literal["sum", "count", "min", "max", "mean"]
FUNCTIONS: tuple[str, ...] = ("sum", "count", "min", "max", "mean")
# The column name that counts rows rather than non-null values (`count("*")` in SQL).
ALL_ROWS = "*"

# The pyarrow functions that make a partial state from rows, and that merge partial states.
_PARTIAL: dict[str, tuple[str, ...]] = {
    "sum": ("sum",),
    "count": ("count",),
    "min": ("min",),
    "max": ("max",),
    "mean": ("sum", "count"),
}
_MERGE = {"sum": "sum", "count": "sum", "min": "min", "max": "max"}


@dataclass(frozen=True)
class Aggregation:
    """`output` = `function`(`column`) per key; `column` "*" with "count" counts rows."""

    output: str
    column: str
    function: AggregateFunction


@dataclass(frozen=True)
class LocalPhase:
    """The local phase a producer runs for its consumers' aggregation: their keys and
    aggregations, and the operator's name for messages."""

    keys: tuple[str, ...]
    aggregations: tuple[Aggregation, ...]
    operator: str


def partial_states(
    batches: Iterable[pa.RecordBatch], phase: LocalPhase, flush_rows: int
) -> Iterator[pa.RecordBatch]:
    """The local phase (Flink's `LocalHashAggregate`): `batches` as partial states per key,
    merged as they pile up. The merged state is held while it stays within `flush_rows` rows and
    passed on once it does not (keys that do not repeat within that many rows gain nothing from
    being held), as Flink's local aggregate flushes when its memory is full: the consumer merges
    every state of a key, so a flush changes how much crosses the exchange, never the result."""
    what = f"operator {phase.operator!r}"
    keys, aggregations = phase.keys, phase.aggregations
    states = (_partial(pa.Table.from_batches([b]), keys, aggregations, what) for b in batches)
    for state in _piled(states, keys, aggregations, flush_rows, flush=True):
        yield from as_batches(state, flush_rows)


def aggregate_batches(
    batches: Iterable[pa.RecordBatch],
    keys: Sequence[str],
    aggregations: Sequence[Aggregation],
    batch_rows: int,
    what: str,
    *,
    merging: bool = False,
) -> Iterator[pa.RecordBatch]:
    """One row per key of `batches`: the keys, then each aggregation's output, in order.
    `merging`: the batches are partial states from the producers' local phase."""
    to_state = _states_in if merging else _partial
    states = (to_state(pa.Table.from_batches([b]), keys, aggregations, what) for b in batches)
    for state in _piled(states, keys, aggregations, batch_rows, flush=False):
        yield from as_batches(_finish(state, keys, aggregations), batch_rows)


def _piled(
    states: Iterable[pa.Table],
    keys: Sequence[str],
    aggregations: Sequence[Aggregation],
    bound: int,
    *,
    flush: bool,
) -> Iterator[pa.Table]:
    """`states` merged (one row per key) whenever more than `bound` rows of them pile up, and
    once more at the end. Without `flush` that is one state, the last and only one yielded (none
    for no states); with it, a merge still above `bound` rows is passed on and the pile starts
    again (the local phase: its consumer merges what it passes on)."""
    pile: list[pa.Table] = []
    rows = 0
    # The pile is one merge's result and nothing since: one row per key already, so the end
    # passes it on as it is rather than merging it again.
    merged_alone = False
    for state in states:
        pile.append(state)
        rows += state.num_rows
        merged_alone = False
        if rows > bound and len(pile) > 1:
            merged = _merge(pile, keys, aggregations)
            if flush and merged.num_rows > bound:
                yield merged
                pile, rows = [], 0
            else:
                pile, rows, merged_alone = [merged], merged.num_rows, True
    if pile:
        yield pile[0] if merged_alone else _merge(pile, keys, aggregations)


def _state_columns(index: int, function: str) -> list[tuple[str, str]]:
    """(state column, the pyarrow function that made it) for aggregation `index`."""
    return [(f"_{index}_{part}", part) for part in _PARTIAL[function]]


def _partial(
    table: pa.Table, keys: Sequence[str], aggregations: Sequence[Aggregation], what: str
) -> pa.Table:
    missing = [
        c
        for c in [*keys, *(a.column for a in aggregations if a.column != ALL_ROWS)]
        if c not in table.column_names
    ]
    if missing:
        raise ValueError(
            f"{what}: no column(s) {sorted(set(missing))} in its input {table.column_names}"
        )
    # One input column per aggregation under a name of its own, so two aggregations of one
    # column (its sum and its mean) never share a result name.
    inputs = {k: table.column(k) for k in keys}
    specs: list[tuple[str, str, pc.FunctionOptions | None]] = []
    for index, agg in enumerate(aggregations):
        name = f"_{index}"
        rows = agg.column == ALL_ROWS
        inputs[name] = table.column(keys[0] if rows else agg.column)
        for _, part in _state_columns(index, agg.function):
            options = pc.CountOptions(mode="all") if part == "count" and rows else None
            specs.append((name, part, options))
    grouped = pa.table(inputs).group_by(list(keys), use_threads=False).aggregate(specs)
    states = [c for i, a in enumerate(aggregations) for c, _ in _state_columns(i, a.function)]
    return grouped.select([*keys, *states])


def _states_in(
    table: pa.Table, keys: Sequence[str], aggregations: Sequence[Aggregation], what: str
) -> pa.Table:
    """The partial states a producer's local phase wrote, in the merge's column order."""
    states = [c for i, a in enumerate(aggregations) for c, _ in _state_columns(i, a.function)]
    missing = [c for c in [*keys, *states] if c not in table.column_names]
    if missing:
        # A producer that wrote rows, not states: the plan and the producer disagree.
        raise ValueError(
            f"{what}: its input holds no partial state column(s) {missing} "
            f"(columns {table.column_names})"
        )
    return table.select([*keys, *states])


def _merge(
    states: list[pa.Table], keys: Sequence[str], aggregations: Sequence[Aggregation]
) -> pa.Table:
    table = pa.concat_tables(states, promote_options="default")
    specs = [
        (column, _MERGE[part])
        for index, agg in enumerate(aggregations)
        for column, part in _state_columns(index, agg.function)
    ]
    merged = table.group_by(list(keys), use_threads=False).aggregate(specs)
    merged = merged.select([*keys, *(f"{column}_{merge}" for column, merge in specs)])
    return merged.rename_columns([*keys, *(column for column, _ in specs)])


def _finish(state: pa.Table, keys: Sequence[str], aggregations: Sequence[Aggregation]) -> pa.Table:
    columns: dict[str, pa.ChunkedArray] = {k: state.column(k) for k in keys}
    for index, agg in enumerate(aggregations):
        parts = [state.column(column) for column, _ in _state_columns(index, agg.function)]
        if agg.function == "mean":
            total, count = parts
            columns[agg.output] = pc.divide(
                pc.cast(total, pa.float64()), pc.cast(count, pa.float64())
            )
        else:
            columns[agg.output] = parts[0]
    result = pa.table(columns)
    return result.sort_by([(k, "ascending") for k in keys])
