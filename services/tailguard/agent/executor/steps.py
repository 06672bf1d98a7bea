"""The steps of a chain: a user operator's function, how it wants its data, and how it runs.

Every step turns record-batch streams into one record-batch stream (`run_chain`), pulled batch
by batch by whoever writes the chain's output, so an attempt holds a few batches per step, not
its input (docs/agent.md, "Operators"; docs/data-plane.md, "Streamed execution"):

- `map_batches`: the function gets each batch (`pa.RecordBatch`); holds one batch.
- `map_in_arrow` / `map_in_pandas`: an iterator of batches / DataFrames, as PySpark's
  `mapInArrow` / `mapInPandas`; holds what the function keeps.
- `filter` / `select`: no function, a `pyarrow.compute` expression per batch; one batch.
- `apply_in_arrow` / `apply_in_pandas`: one key group per call, as PySpark's `applyInArrow` /
  `applyInPandas`; holds one group and a bounded buffer (`groups.py`).
- `aggregate`: no function; sums, counts, min, max and mean per batch, combined
  (`aggregation.py`); holds one row per key.
- `join`: no function; two inputs joined on key columns as `df.join(other, on, how)`
  (`joins.py`); holds its build side up to a bound, spilling beyond it.
- `arrow` / `pandas` (`map`, `map_pandas`, `join(other, fn)`, `combine`): the whole input, one
  table per input; holds the whole input.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow as pa
import pyarrow.dataset as pa_dataset

from tailguard.agent.executor.aggregation import Aggregation, aggregate_batches
from tailguard.agent.executor.batches import (
    as_batches,
    collect,
    conformed,
    split_rows,
    with_schema_batch,
)
from tailguard.agent.executor.groups import key_groups
from tailguard.agent.executor.joins import JoinSpec, hash_join
from tailguard.agent.executor.spill import SpillStats

StepStyle = Literal[
    "arrow",
    "pandas",
    "map_batches",
    "map_in_arrow",
    "map_in_pandas",
    "filter",
    "select",
    "apply_in_arrow",
    "apply_in_pandas",
    "aggregate",
    "join",
]

# Styles whose function gets its whole input at once: they read any number of inputs.
WHOLE_INPUT_STYLES: frozenset[str] = frozenset({"arrow", "pandas"})
# Styles that declare no function: what they do is in the step's own fields.
BUILT_IN_STYLES: frozenset[str] = frozenset({"filter", "select", "aggregate", "join"})
# How many inputs a style reads when it is not one (the whole-input styles read any number).
INPUTS: dict[str, int] = {"join": 2}


@dataclass(frozen=True)
class OperatorStep:
    name: str
    fn: Callable[..., Any] | None = None
    # "arrow": fn gets pyarrow Tables; "pandas": fn gets pandas DataFrames (whole input); the
    # other styles are in the module docstring.
    style: StepStyle = "arrow"
    # apply_in_* and aggregate: the group keys (those of the exchange before the step).
    keys: tuple[str, ...] = ()
    # map_in_*, apply_in_*: the declared output schema (None: the first result's).
    schema: pa.Schema | None = None
    # filter: a boolean `pyarrow.compute` expression.
    predicate: Any = None
    # select: output column name -> `pyarrow.compute` expression, in order.
    projections: tuple[tuple[str, Any], ...] = ()
    # aggregate: what to compute per key, and whether its input is the partial states of its
    # producers' local phase (a two-phase aggregation: agent/driver/local_aggregation.py).
    aggregations: tuple[Aggregation, ...] = ()
    merging: bool = False
    # join: keys, join type, which side is held in memory and its bound.
    join: JoinSpec | None = None


@dataclass(frozen=True)
class StepContext:
    """What steps need from the attempt running them."""

    # Rows per batch (the `python.fn-execution.arrow.batch.size` setting).
    batch_rows: int
    # A local directory for group assembly's spill files, removed with the attempt.
    spill_dir: str
    # The cooperative cancellation check, called per batch and per group.
    check: Callable[[], None]
    # What the steps spilled to `spill_dir` (reported with the attempt's outcome).
    spill: SpillStats = field(default_factory=SpillStats)


Stream = Iterator[pa.RecordBatch]


def run_chain(steps: Iterable[OperatorStep], inputs: list[Stream], context: StepContext) -> Stream:
    """The chain's steps one after the other, as one lazy stream: the head gets every input (a
    join gets one stream per input), each next step the previous one's output."""
    chain = list(steps)
    if not chain:
        if len(inputs) != 1:
            raise ValueError(f"{len(inputs)} inputs but no operator to combine them")
        return inputs[0]
    stream = run_step(chain[0], inputs, context)
    for step in chain[1:]:
        stream = run_step(step, [stream], context)
    return stream


def run_step(step: OperatorStep, inputs: list[Stream], context: StepContext) -> Stream:
    expected = INPUTS.get(step.style, 1)
    if len(inputs) != expected and step.style not in WHOLE_INPUT_STYLES:
        raise ValueError(
            f"operator {step.name!r} ({step.style}) reads {expected} input(s), got "
            f"{len(inputs)}: combine several inputs with join() or Job.combine()"
        )
    output = _RUNNERS[step.style](step, inputs, context)
    what = f"operator {step.name!r}"
    return _checked(conformed(with_schema_batch(output), what, step.schema), context)


def _checked(stream: Stream, context: StepContext) -> Stream:
    """Per batch leaving a step: the cancellation check, and batches no longer than the batch
    size (a function may return more rows than it got)."""
    for batch in stream:
        context.check()
        yield from split_rows(batch, context.batch_rows)


# ---------------------------------------------------------------------------- the styles


def _whole(step: OperatorStep, inputs: list[Stream], context: StepContext) -> Stream:
    tables = [collect(stream) for stream in inputs]
    args: list[Any] = [t.to_pandas() for t in tables] if step.style == "pandas" else tables
    yield from as_batches(_fn(step)(*args), context.batch_rows)


def _map_batches(step: OperatorStep, inputs: list[Stream], context: StepContext) -> Stream:
    fn = _fn(step)
    for batch in inputs[0]:
        yield from as_batches(fn(batch), context.batch_rows)


def _map_in_arrow(step: OperatorStep, inputs: list[Stream], context: StepContext) -> Stream:
    for result in _results(step, _fn(step)(inputs[0])):
        if not isinstance(result, pa.RecordBatch | pa.Table):
            raise TypeError(
                f"operator {step.name!r} (map_in_arrow) must yield pyarrow.RecordBatch, "
                f"got {type(result).__name__}"
            )
        yield from as_batches(result, context.batch_rows)


def _map_in_pandas(step: OperatorStep, inputs: list[Stream], context: StepContext) -> Stream:
    import pandas as pd

    frames = (batch.to_pandas() for batch in inputs[0])
    for result in _results(step, _fn(step)(frames)):
        if not isinstance(result, pd.DataFrame):
            raise TypeError(
                f"operator {step.name!r} (map_in_pandas) must yield pandas.DataFrame, "
                f"got {type(result).__name__}"
            )
        yield from as_batches(result, context.batch_rows)


def _results(step: OperatorStep, returned: Any) -> Iterator[Any]:
    """What an iterator-style function returned, as an iterator (a clear error when it returned
    one frame or table instead of yielding them)."""
    if isinstance(returned, pa.RecordBatch | pa.Table) or _is_frame(returned):
        raise TypeError(
            f"operator {step.name!r} ({step.style}) must take an iterator and yield its results "
            f"(a generator), but returned one {type(returned).__name__}; for a function of "
            f"one batch use map_batches"
        )
    try:
        return iter(returned)
    except TypeError:
        raise TypeError(
            f"operator {step.name!r} ({step.style}) must yield its results, "
            f"returned {type(returned).__name__}"
        ) from None


def _is_frame(value: Any) -> bool:
    return type(value).__name__ == "DataFrame" and hasattr(value, "columns")


def _filter(step: OperatorStep, inputs: list[Stream], context: StepContext) -> Stream:
    for batch in inputs[0]:
        yield batch.filter(step.predicate)


def _select(step: OperatorStep, inputs: list[Stream], context: StepContext) -> Stream:
    columns = dict(step.projections)
    for batch in inputs[0]:
        table = pa_dataset.dataset([batch]).to_table(columns=columns, use_threads=False)
        yield from as_batches(table, context.batch_rows)


def _apply_in_groups(step: OperatorStep, inputs: list[Stream], context: StepContext) -> Stream:
    fn = _fn(step)
    with_key = takes_key(fn)
    pandas = step.style == "apply_in_pandas"
    for key, group in key_groups(
        inputs[0], step.keys, context.batch_rows, context.spill_dir, context.check, context.spill
    ):
        data: Any = group.to_pandas() if pandas else group
        result = fn(key, data) if with_key else fn(data)
        yield from as_batches(result, context.batch_rows)


def _aggregate(step: OperatorStep, inputs: list[Stream], context: StepContext) -> Stream:
    return aggregate_batches(
        inputs[0],
        step.keys,
        step.aggregations,
        context.batch_rows,
        f"operator {step.name!r}",
        merging=step.merging,
    )


def _join(step: OperatorStep, inputs: list[Stream], context: StepContext) -> Stream:
    if step.join is None:
        raise ValueError(f"operator {step.name!r} (join) has no join specification")
    left, right = inputs
    return hash_join(
        left, right, step.join, context.batch_rows, context.spill_dir, context.check, context.spill
    )


_RUNNERS: dict[str, Callable[[OperatorStep, list[Stream], StepContext], Stream]] = {
    "arrow": _whole,
    "pandas": _whole,
    "map_batches": _map_batches,
    "map_in_arrow": _map_in_arrow,
    "map_in_pandas": _map_in_pandas,
    "filter": _filter,
    "select": _select,
    "apply_in_arrow": _apply_in_groups,
    "apply_in_pandas": _apply_in_groups,
    "aggregate": _aggregate,
    "join": _join,
}


def _fn(step: OperatorStep) -> Callable[..., Any]:
    if step.fn is None:
        raise ValueError(f"operator {step.name!r} ({step.style}) has no function")
    return step.fn


def takes_key(fn: Callable[..., Any]) -> bool:
    """Whether a group function takes the key first, `fn(key, group)`, as PySpark decides for
    `applyInPandas`: by its number of positional parameters (two: with the key; one: without).
    ValueError for any other shape."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False  # a builtin without a signature: called with the group alone
    positional = [
        p
        for p in parameters
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    if any(p.kind is p.VAR_POSITIONAL for p in parameters) or len(positional) == 1:
        return False
    if len(positional) == 2:
        return True
    raise ValueError(
        f"a group function takes (group) or (key, group), but {getattr(fn, '__name__', fn)!r} "
        f"takes {len(positional)} positional parameters"
    )
