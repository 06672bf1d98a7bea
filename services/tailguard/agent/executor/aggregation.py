"""Built-in aggregation per key (`partition_by(keys).aggregate(...)`), computed per batch and
combined, so the common aggregation needs no user function and holds one row per key.

Each batch is reduced to a partial state per key with pyarrow's hash aggregation; states are
merged whenever they pile up past one batch of rows, and once more at the end: sums and counts
add up, minima and maxima take their own extreme, a mean is kept as its sum and count and
divided last (Spark's `avg` does the same). Results come out sorted by key (nulls last), so the
same input always gives the same partition.
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


def aggregate_batches(
    batches: Iterable[pa.RecordBatch],
    keys: Sequence[str],
    aggregations: Sequence[Aggregation],
    batch_rows: int,
    what: str,
) -> Iterator[pa.RecordBatch]:
    """One row per key of `batches`: the keys, then each aggregation's output, in order."""
    states: list[pa.Table] = []
    state_rows = 0
    for batch in batches:
        state = _partial(pa.Table.from_batches([batch]), keys, aggregations, what)
        states.append(state)
        state_rows += state.num_rows
        if state_rows > batch_rows and len(states) > 1:
            states = [_merge(states, keys, aggregations)]
            state_rows = states[0].num_rows
    if not states:
        return
    result = _finish(_merge(states, keys, aggregations), keys, aggregations)
    yield from as_batches(result, batch_rows)


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
