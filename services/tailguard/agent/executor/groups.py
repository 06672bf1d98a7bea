"""Key groups assembled from a stream in bounded memory, for `apply_in_pandas` / `apply_in_arrow`.

PySpark's `groupBy(...).applyInPandas` hands the function one whole group at a time, so a group
must fit in memory, but the subtask's input need not. tailguard assembles groups the way a grace
hash join partitions its build side:

1. The stream is buffered up to a budget (`GROUP_BUDGET_BATCHES` batches' worth of rows). If it
   ends within the budget, its groups come straight from memory.
2. Otherwise every batch is split by a hash of its keys into `SPILL_FANOUT` buckets, each an
   Arrow IPC stream in a local spill file, so a bucket holds whole groups.
3. Buckets are taken one at a time: one within the budget is read, sorted by key and cut into
   groups; a larger one is split again with the next level's hash (a group larger than the
   budget alone is read whole after `MAX_SPILL_LEVELS`: it must fit, as in PySpark).

Groups come out in a fixed order (bucket by bucket, keys ascending within a bucket, rows in input
order within a group), so an attempt re-run over the same input writes the same partition.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tailguard.agent.executor.batches import SchemaConformer
from tailguard.agent.executor.exchange import key_hashes, remix

# Rows grouped in memory at once, in batches: a bucket above it is split again.
GROUP_BUDGET_BATCHES = 2
SPILL_FANOUT = 32
MAX_SPILL_LEVELS = 4

Key = tuple[Any, ...]


def key_groups(
    batches: Iterable[pa.RecordBatch],
    keys: Sequence[str],
    batch_rows: int,
    spill_dir: str,
    check: Callable[[], None],
) -> Iterator[tuple[Key, pa.Table]]:
    """(key values, the group's rows) for every key group of `batches`, holding about
    `GROUP_BUDGET_BATCHES` × `batch_rows` rows plus the largest group."""
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
        buckets = _spill(_chain(held, rest), keys, 0, directory, check)
        del held
        yield from _groups_of_buckets(buckets, keys, budget, 0, directory, check)


def _chain(first: list[pa.RecordBatch], rest: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    while first:
        yield first.pop(0)  # released once written, not held to the end
    yield from rest


def _require_keys(schema: pa.Schema, keys: Sequence[str]) -> None:
    missing = [k for k in keys if k not in schema.names]
    if missing:
        raise ValueError(f"group key(s) {missing} not in the input's columns {schema.names}")


def _bucket_of(batch: pa.RecordBatch, keys: Sequence[str], level: int) -> np.ndarray:
    hashes, _ = key_hashes(pa.Table.from_batches([batch]), keys)
    # Another mix per level: the exchange already sent this subtask the rows of one residue of
    # the plain hash, and a bucket split again must spread over new buckets.
    return (remix(hashes, level + 1) % np.uint64(SPILL_FANOUT)).astype(np.int64)


def _spill(
    batches: Iterable[pa.RecordBatch],
    keys: Sequence[str],
    level: int,
    directory: str,
    check: Callable[[], None],
) -> list[tuple[str, int]]:
    """Split `batches` into bucket files by key hash; (path, rows) per bucket."""
    into = tempfile.mkdtemp(prefix=f"level{level}-", dir=directory)
    paths = [os.path.join(into, f"{b}.arrow") for b in range(SPILL_FANOUT)]
    rows = [0] * SPILL_FANOUT
    with contextlib.ExitStack() as stack:
        writers: dict[int, pa.ipc.RecordBatchStreamWriter] = {}
        for batch in batches:
            check()
            if not batch.num_rows:
                continue
            buckets = _bucket_of(batch, keys, level)
            order = np.argsort(buckets, kind="stable")
            counts = np.bincount(buckets, minlength=SPILL_FANOUT)
            grouped = batch.take(pa.array(order))
            start = 0
            for bucket, count in enumerate(counts.tolist()):
                if not count:
                    continue
                if bucket not in writers:
                    sink = stack.enter_context(pa.OSFile(paths[bucket], "wb"))
                    writers[bucket] = stack.enter_context(pa.ipc.new_stream(sink, batch.schema))
                writers[bucket].write_batch(grouped.slice(start, count))
                rows[bucket] += count
                start += count
    return [(paths[b], rows[b]) for b in range(SPILL_FANOUT) if rows[b]]


def _groups_of_buckets(
    buckets: list[tuple[str, int]],
    keys: Sequence[str],
    budget: int,
    level: int,
    directory: str,
    check: Callable[[], None],
) -> Iterator[tuple[Key, pa.Table]]:
    for path, rows in buckets:
        if rows <= budget or level + 1 >= MAX_SPILL_LEVELS:
            with pa.OSFile(path, "rb") as source:
                table = pa.ipc.open_stream(source).read_all()
            os.remove(path)
            yield from _groups_in_memory(table, keys, check)
            continue
        with pa.OSFile(path, "rb") as source:
            finer = _spill(pa.ipc.open_stream(source), keys, level + 1, directory, check)
        os.remove(path)
        yield from _groups_of_buckets(finer, keys, budget, level + 1, directory, check)


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
