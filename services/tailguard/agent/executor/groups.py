"""Key groups assembled from a stream in bounded memory, for `apply_in_pandas` / `apply_in_arrow`.

PySpark's `groupBy(...).applyInPandas` hands the function one whole group at a time, so a group
must fit in memory, but the subtask's input need not. tailguard assembles groups the way a grace
hash join partitions its build side:

1. The stream is buffered up to a budget (`GROUP_BUDGET_BATCHES` batches' worth of rows). If it
   ends within the budget, its groups come straight from memory.
2. Otherwise every batch is split by a hash of its keys into `SPILL_FANOUT` buckets, each an
   Arrow IPC stream in a local spill file, so a bucket holds whole groups (`spill.py`, shared
   with the join's build side).
3. Buckets are taken one at a time: one within the budget is read, sorted by key and cut into
   groups; a larger one is split again with the next level's hash (a group larger than the
   budget alone is read whole after `MAX_SPILL_LEVELS`: it must fit, as in PySpark).

Groups come out in a fixed order (bucket by bucket, keys ascending within a bucket, rows in input
order within a group), so an attempt re-run over the same input writes the same partition.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tailguard.agent.executor.batches import SchemaConformer
from tailguard.agent.executor.spill import (
    MAX_SPILL_LEVELS,
    Bucket,
    Spiller,
    SpillStats,
    read_bucket,
)

# Rows grouped in memory at once, in batches: a bucket above it is split again.
GROUP_BUDGET_BATCHES = 2

Key = tuple[Any, ...]


def key_groups(
    batches: Iterable[pa.RecordBatch],
    keys: Sequence[str],
    batch_rows: int,
    spill_dir: str,
    check: Callable[[], None],
    stats: SpillStats | None = None,
) -> Iterator[tuple[Key, pa.Table]]:
    """(key values, the group's rows) for every key group of `batches`, holding about
    `GROUP_BUDGET_BATCHES` × `batch_rows` rows plus the largest group; what is spilled is
    counted in `stats`."""
    if not keys:
        raise ValueError("key groups need at least one key column")
    budget = GROUP_BUDGET_BATCHES * batch_rows
    conformer = SchemaConformer("the input of a group operator")
    held: list[pa.RecordBatch] = []
    held_rows = 0
    stream = iter(batches)
    for batch in stream:
        check()
        batch = conformer.conform(batch)
        if not batch.num_rows:
            continue
        _require_keys(batch.schema, keys)
        held.append(batch)
        held_rows += batch.num_rows
        if held_rows > budget:
            break
    else:
        yield from _groups_in_memory(pa.Table.from_batches(held) if held else None, keys, check)
        return
    with tempfile.TemporaryDirectory(prefix="groups-", dir=spill_dir) as directory:
        rest = (conformer.conform(b) for b in stream)
        spiller = Spiller(tuple(keys), directory, check, stats, rows_at_once=batch_rows)
        buckets = spiller.spill(_chain(held, rest))
        del held
        yield from _groups_of_buckets(buckets.values(), budget, spiller)


def _chain(first: list[pa.RecordBatch], rest: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    while first:
        yield first.pop(0)  # released once written, not held to the end
    yield from rest


def _require_keys(schema: pa.Schema, keys: Sequence[str]) -> None:
    missing = [k for k in keys if k not in schema.names]
    if missing:
        raise ValueError(f"group key(s) {missing} not in the input's columns {schema.names}")


def _groups_of_buckets(
    buckets: Iterable[Bucket], budget: int, spiller: Spiller
) -> Iterator[tuple[Key, pa.Table]]:
    for bucket in buckets:
        if bucket.rows <= budget or bucket.level + 1 >= MAX_SPILL_LEVELS:
            yield from _groups_in_memory(read_bucket(bucket), spiller.keys, spiller.check)
            continue
        yield from _groups_of_buckets(spiller.split(bucket).values(), budget, spiller)


def _groups_in_memory(
    table: pa.Table | None, keys: Sequence[str], check: Callable[[], None]
) -> Iterator[tuple[Key, pa.Table]]:
    """The groups of `table`, keys ascending (nulls last), rows in input order in a group."""
    if table is None or not table.num_rows:
        return
    order = pc.sort_indices(table, sort_keys=[(k, "ascending", "at_end") for k in keys])
    ordered = table.take(order).combine_chunks()
    changes = np.zeros(ordered.num_rows - 1, dtype=bool)
    for k in keys:
        changes |= _changes(ordered.column(k).combine_chunks())
    starts = np.concatenate(([0], np.flatnonzero(changes) + 1, [ordered.num_rows]))
    for start, end in zip(starts[:-1].tolist(), starts[1:].tolist(), strict=True):
        check()
        group = ordered.slice(start, end - start)
        yield tuple(group.column(k)[0].as_py() for k in keys), group


def _changes(column: pa.Array) -> np.ndarray:
    """Whether each row's key differs from the previous row's (nulls equal, NaNs equal)."""
    after, before = column.slice(1), column.slice(0, len(column) - 1)
    differ = pc.fill_null(pc.not_equal(after, before), True)
    same = pc.and_(pc.is_null(after), pc.is_null(before))
    if pa.types.is_floating(column.type):
        both_nan = pc.fill_null(pc.and_(pc.is_nan(after), pc.is_nan(before)), False)
        same = pc.or_(same, both_nan)
    result = pc.and_(differ, pc.invert(same))
    return np.asarray(result.to_numpy(zero_copy_only=False), dtype=bool)
