"""The relational join, `a.join(b, on=..., how=...)`: a hash join over co-partitioned inputs.

Each subtask gets the rows of the same keys from both sides (both hash-partitioned on the join
keys into the same subpartitions, or one side broadcast), as Spark's shuffled hash join does:

1. The **build** side (the right one; the left one for a right join, or whichever side is
   broadcast) is read into memory up to `JoinSpec.memory_bytes`.
2. If it ends within that bound, the **probe** side streams past it: its batches are joined in
   chunks (pyarrow's hash join, over the key columns and a row number of each side, so every
   column type travels, nested ones too, by `take`), each chunk holding about as many rows as
   the build side so that hashing the build side again per chunk costs no more than the probe
   itself, and at most a quarter of the bound in bytes.
3. Otherwise both sides are spilled by key hash into local bucket files (`spill.py`, the group
   operators' mechanism; rows with a null key, which never match, spread over all buckets), and
   the buckets are joined pairwise: a build bucket within the bound is read whole and the
   probe bucket streams past it as above; a larger one is split again, both sides alike. After
   `MAX_SPILL_LEVELS` splits a bucket is read whole: its rows share one key, which must fit, as
   in Spark's shuffled hash join.

Semantics are Spark's for `df.join(other, on=[names], how=...)` (a USING join): a null key
never matches (not even another null); rows the join keeps unmatched get nulls for the other
side's columns; the output has the key columns once (for a full join, whichever side has the
key), then the left side's other columns, then the right side's (none for semi and anti).
Float keys compare as Spark normalises them: -0.0 equals 0.0 and NaN equals NaN. Rows come
out in a fixed order for the same input (probe order, then build order within a key).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tailguard.agent.executor.spill import (
    MAX_SPILL_LEVELS,
    Bucket,
    Spiller,
    SpillStats,
    bucket_batches,
    discard_bucket,
)
from tailguard.decider.policy import broadcast_join

JoinHow = Literal["inner", "left", "right", "full", "semi", "anti"]
Side = Literal["left", "right"]

# PySpark's spellings of `how` (`DataFrame.join`), each to tailguard's name for it.
HOW_SPELLINGS: dict[str, JoinHow] = {
    "inner": "inner",
    "left": "left",
    "leftouter": "left",
    "left_outer": "left",
    "right": "right",
    "rightouter": "right",
    "right_outer": "right",
    "full": "full",
    "outer": "full",
    "fullouter": "full",
    "full_outer": "full",
    "semi": "semi",
    "leftsemi": "semi",
    "left_semi": "semi",
    "anti": "anti",
    "leftanti": "anti",
    "left_anti": "anti",
}

# Which sides each join type may broadcast: the decider's table, which the adaptive broadcast
# join (decider/policy/broadcast_join.py) decides by too.
BROADCASTABLE = broadcast_join.BROADCASTABLE

DEFAULT_MEMORY_BYTES = 64 * 1024 * 1024
# What pyarrow's hash join holds per build row besides the build side's own data, counted
# against the bound: its hash table over the keys and row numbers. Measured: 4M rows of an
# int64 key and an int32 row number, 46 MiB, made the join allocate 202 MiB (~52 B a row).
HASH_TABLE_ROW_BYTES = 56

_PROBE_ROW = "__tailguard_probe_row"
_BUILD_ROW = "__tailguard_build_row"


@dataclass(frozen=True)
class JoinSpec:
    """What the join operator does; `build` is the side held in memory."""

    on: tuple[str, ...]
    how: JoinHow
    build: Side
    memory_bytes: int = DEFAULT_MEMORY_BYTES

    def __post_init__(self) -> None:
        if not self.on:
            raise ValueError("a join needs at least one key column")
        if self.how in ("semi", "anti") and self.build != "right":
            raise ValueError(f"a {self.how} join keeps left rows: it builds the right side")
        if self.memory_bytes < 1:
            raise ValueError(
                f"join memory must be a positive number of bytes, got {self.memory_bytes}"
            )

    @property
    def probe(self) -> Side:
        return "left" if self.build == "right" else "right"

    @property
    def keeps_unmatched_probe(self) -> bool:
        return self.how == "anti" or self.how == "full" or self.how == self.probe

    @property
    def keeps_unmatched_build(self) -> bool:
        return self.how == "full" or self.how == self.build


def resident_bytes(data_bytes: int, rows: int) -> int:
    """What holding a build side of `data_bytes` in `rows` rows costs, hash table included."""
    return data_bytes + rows * HASH_TABLE_ROW_BYTES


def join_how(how: str) -> JoinHow:
    """`how` as PySpark spells it (`"left_outer"`, `"leftsemi"`, ...), or ValueError."""
    normalised = HOW_SPELLINGS.get(how.lower() if isinstance(how, str) else "")
    if normalised is None:
        raise ValueError(
            f"join how={how!r}: use one of inner, left, right, full, semi, anti (or PySpark's "
            f"spellings: outer, left_outer, leftsemi, left_anti, ...)"
        )
    return normalised


def default_build(how: JoinHow) -> Side:
    """The side held in memory when neither is broadcast: the right one, except for a right
    join, whose unmatched right rows are then the streamed side's (Spark's shuffled hash join
    builds the same sides)."""
    return "left" if how == "right" else "right"


def hash_join(
    left: Iterable[pa.RecordBatch],
    right: Iterable[pa.RecordBatch],
    spec: JoinSpec,
    batch_rows: int,
    spill_dir: str,
    check: Callable[[], None],
    stats: SpillStats | None = None,
) -> Iterator[pa.RecordBatch]:
    """The join of two co-partitioned streams (module docstring). Each stream carries at least
    one batch, which tells its schema (the streams' rule, `batches.py`)."""
    lefts, rights = iter(left), iter(right)
    first_left, first_right = next(lefts, None), next(rights, None)
    if first_left is None or first_right is None:
        raise ValueError("join: an input stream carries no batch, so its columns are unknown")
    layout = _Layout.of(spec, first_left.schema, first_right.schema)
    streams = {
        "left": layout.prepared("left", chain([first_left], lefts)),
        "right": layout.prepared("right", chain([first_right], rights)),
    }
    builds, probes = streams[spec.build], streams[spec.probe]
    held, held_bytes = _held(builds, spec.memory_bytes, check)
    if held_bytes <= spec.memory_bytes:  # the whole build side: it fits
        build = _one_chunk(held, layout.schema(spec.build))
        yield from _join_resident(build, probes, layout, batch_rows, check)
    else:
        with tempfile.TemporaryDirectory(prefix="join-", dir=spill_dir) as directory:
            # Rows split at once: a quarter of the bound's worth, but never fewer than a batch.
            row_bytes = max(1, held_bytes // max(1, sum(b.num_rows for b in held)))
            at_once = max(batch_rows, spec.memory_bytes // 4 // row_bytes)
            spiller = Spiller(spec.on, directory, check, stats, True, at_once)
            build_buckets = spiller.spill(_drain(held, builds))
            probe_buckets = spiller.spill(probes)
            yield from _join_buckets(build_buckets, probe_buckets, layout, batch_rows, spiller)
    # Tells the output's columns when no row was joined (a stream's rule, `batches.py`).
    yield pa.RecordBatch.from_pylist([], schema=layout.output)


def _held(
    builds: Iterator[pa.RecordBatch], bound: int, check: Callable[[], None]
) -> tuple[list[pa.RecordBatch], int]:
    """The build side's batches up to the first that takes it over `bound`, and what they
    cost held (`resident_bytes`): at most `bound` when that was all of them."""
    held: list[pa.RecordBatch] = []
    held_bytes = 0
    for batch in builds:
        check()
        held.append(batch)
        held_bytes += resident_bytes(batch.nbytes, batch.num_rows)
        if held_bytes > bound:
            break
    return held, held_bytes


def _drain(first: list[pa.RecordBatch], rest: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    while first:
        yield first.pop(0)  # released once spilled, not held to the end
    yield from rest


@dataclass(frozen=True)
class _Layout:
    """Both sides' schemas with the key types made one, and the output's columns."""

    spec: JoinSpec
    left: pa.Schema
    right: pa.Schema
    output: pa.Schema

    @staticmethod
    def of(spec: JoinSpec, left: pa.Schema, right: pa.Schema) -> _Layout:
        for side, schema in (("left", left), ("right", right)):
            missing = [k for k in spec.on if k not in schema.names]
            if missing:
                raise ValueError(
                    f"join on {list(spec.on)}: the {side} side has no column(s) {missing}; its "
                    f"columns are {schema.names}"
                )
        types = {k: _key_type(k, left.field(k).type, right.field(k).type) for k in spec.on}
        left_rest = [f for f in left if f.name not in spec.on]
        right_rest = [f for f in right if f.name not in spec.on]
        if spec.how not in ("semi", "anti"):
            shared = sorted({f.name for f in left_rest} & {f.name for f in right_rest})
            if shared:
                raise ValueError(
                    f"join on {list(spec.on)}: column(s) {shared} are on both sides and not "
                    f"join keys; rename one side's first (select), since the output would "
                    f"hold two columns of one name"
                )
        else:
            right_rest = []
        keys = [pa.field(k, types[k]) for k in spec.on]
        return _Layout(
            spec,
            _with_key_types(left, types),
            _with_key_types(right, types),
            pa.schema([*keys, *left_rest, *right_rest]),
        )

    def schema(self, side: Side) -> pa.Schema:
        return self.left if side == "left" else self.right

    def prepared(self, side: Side, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The side's batches with its key columns cast to the shared types and float keys
        normalised; rows with a null key are dropped when the join cannot keep them."""
        schema = self.schema(side)
        keeps = (
            self.spec.keeps_unmatched_probe
            if side == self.spec.probe
            else self.spec.keeps_unmatched_build
        )
        for batch in batches:
            columns = []
            for field, column in zip(schema, batch.columns, strict=True):
                if field.name in self.spec.on:
                    column = column.cast(field.type) if column.type != field.type else column
                    if pa.types.is_floating(field.type):
                        column = pc.add(column, pa.scalar(0.0, field.type))  # -0.0 -> 0.0
                columns.append(column)
            batch = pa.RecordBatch.from_arrays(columns, schema=schema)
            if not keeps:
                batch = _without_null_keys(batch, self.spec.on)
            if batch.num_rows:
                yield batch

    def assemble(self, probe: pa.Table | None, build: pa.Table | None, rows: int) -> pa.Table:
        """Output rows from the probe side's and the build side's rows, aligned (None: that
        side's columns are null); the keys come from the probe side when it is given."""
        parts = {self.spec.probe: probe, self.spec.build: build}
        keyed = probe if probe is not None else build
        assert keyed is not None
        columns: list[pa.ChunkedArray | pa.Array] = []
        for index, field in enumerate(self.output):
            if index < len(self.spec.on):
                columns.append(keyed.column(field.name))
                continue
            side: Side = "left" if field.name in self.left.names else "right"
            part = parts[side]
            columns.append(
                part.column(field.name) if part is not None else pa.nulls(rows, field.type)
            )
        return pa.Table.from_arrays(columns, schema=self.output)


def _key_type(key: str, left: pa.DataType, right: pa.DataType) -> pa.DataType:
    """The type both sides' `key` is compared in. Sides must agree on the kind of value,
    because the exchange hashed each side's own values (an int 1 and a float 1.0 hash apart)."""
    left, right = _decoded(left), _decoded(right)
    if left == right or pa.types.is_null(right):
        return left
    if pa.types.is_null(left):  # a side that only ever saw nulls there
        return right
    if _kind(left) is not None and _kind(left) == _kind(right):
        try:
            unified = pa.unify_schemas(
                [pa.schema([(key, left)]), pa.schema([(key, right)])],
                promote_options="permissive",
            )
            return unified.field(key).type
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            pass
    raise ValueError(
        f"join key {key!r} is {left} on the left and {right} on the right; cast one side "
        f"to the other's type first (select with pc.cast)"
    )


def _decoded(t: pa.DataType) -> pa.DataType:
    return t.value_type if pa.types.is_dictionary(t) else t


def _kind(t: pa.DataType) -> str | None:
    """Types whose equal values hash alike in the exchange (`exchange._hash_column`)."""
    if pa.types.is_integer(t):
        return "integer"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "text"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return "binary"
    return None


def _with_key_types(schema: pa.Schema, types: dict[str, pa.DataType]) -> pa.Schema:
    return pa.schema(
        [pa.field(f.name, types[f.name]) if f.name in types else f for f in schema],
        metadata=schema.metadata,
    )


def _without_null_keys(batch: pa.RecordBatch, keys: Sequence[str]) -> pa.RecordBatch:
    if not any(batch.column(k).null_count for k in keys):
        return batch
    valid = pc.is_valid(batch.column(keys[0]))
    for k in keys[1:]:
        valid = pc.and_(valid, pc.is_valid(batch.column(k)))
    return batch.filter(valid)


# ---------------------------------------------------------------------------- joining


def _join_buckets(
    builds: dict[int, Bucket],
    probes: dict[int, Bucket],
    layout: _Layout,
    batch_rows: int,
    spiller: Spiller,
) -> Iterator[pa.RecordBatch]:
    """Buckets of equal index from both sides, joined pair by pair (keys never cross
    buckets)."""
    spec = layout.spec
    for index in sorted(builds.keys() | probes.keys()):
        build, probe = builds.get(index), probes.get(index)
        if (build is None and not spec.keeps_unmatched_probe) or (
            probe is None and not spec.keeps_unmatched_build
        ):
            for bucket in (build, probe):
                if bucket is not None:
                    discard_bucket(bucket)
            continue
        if (
            build is not None
            and resident_bytes(build.bytes, build.rows) > spec.memory_bytes
            and build.level + 1 < MAX_SPILL_LEVELS
        ):
            finer_probes = spiller.split(probe) if probe is not None else {}
            yield from _join_buckets(
                spiller.split(build), finer_probes, layout, batch_rows, spiller
            )
            continue
        schema = layout.schema(spec.build)
        table = (
            _one_chunk(list(bucket_batches(build)), schema)
            if build is not None
            else schema.empty_table()
        )
        batches = bucket_batches(probe) if probe is not None else iter(())
        yield from _join_resident(table, batches, layout, batch_rows, spiller.check)


def _join_resident(
    build: pa.Table,
    probes: Iterable[pa.RecordBatch],
    layout: _Layout,
    batch_rows: int,
    check: Callable[[], None],
) -> Iterator[pa.RecordBatch]:
    """The probe stream joined, chunk by chunk, with a build side held in memory (in one
    chunk per column: `take` from many chunks is ~80x slower)."""
    spec = layout.spec
    build_keys = build.select(list(spec.on)).append_column(_BUILD_ROW, _row_numbers(build.num_rows))
    matched = np.zeros(build.num_rows, dtype=bool) if spec.keeps_unmatched_build else None
    # About as many probe rows per chunk as the build side has (each chunk hashes the build
    # side's keys again), within a quarter of the bound.
    chunk_rows = max(batch_rows, build.num_rows)
    chunk_bytes = max(1, spec.memory_bytes // 4)
    for chunk in _chunks(probes, chunk_rows, chunk_bytes, check):
        probe_rows, build_rows = _matches(chunk, build_keys, spec)
        if matched is not None:
            matched[build_rows[build_rows >= 0]] = True
        for start in range(0, len(probe_rows), batch_rows):
            check()
            p = probe_rows[start : start + batch_rows]
            b = build_rows[start : start + batch_rows]
            probe_part = chunk.take(pa.array(p))
            build_part = (
                None if spec.how in ("semi", "anti") else build.take(pa.array(b, mask=b < 0))
            )
            yield from layout.assemble(probe_part, build_part, len(p)).to_batches()
    if matched is not None:
        unmatched = np.flatnonzero(~matched)
        for start in range(0, len(unmatched), batch_rows):
            check()
            rows = unmatched[start : start + batch_rows]
            yield from layout.assemble(None, build.take(pa.array(rows)), len(rows)).to_batches()


def _matches(
    chunk: pa.Table, build_keys: pa.Table, spec: JoinSpec
) -> tuple[np.ndarray, np.ndarray]:
    """(probe row, build row) of every output row of the chunk, in probe order then build
    order; build row -1 where the probe row is unmatched (or for semi and anti, which take
    probe rows only). Unmatched build rows are the caller's (`matched`)."""
    if spec.how in ("semi", "anti"):
        join_type = f"left {spec.how}"
    else:
        join_type = "left outer" if spec.keeps_unmatched_probe else "inner"
    probe_keys = chunk.select(list(spec.on)).append_column(_PROBE_ROW, _row_numbers(chunk.num_rows))
    try:
        pairs = probe_keys.join(build_keys, list(spec.on), join_type=join_type, use_threads=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
        raise ValueError(f"join on {list(spec.on)}: {err}") from None
    probe_rows = np.asarray(pairs.column(_PROBE_ROW).to_numpy(), dtype=np.int64)
    if spec.how in ("semi", "anti"):
        return np.sort(probe_rows), np.full(len(probe_rows), -1, dtype=np.int64)
    build_rows = np.asarray(pc.fill_null(pairs.column(_BUILD_ROW), -1).to_numpy(), dtype=np.int64)
    # Acero's output order is its own: sorted, the same input always gives the same rows in
    # the same order (a re-produced partition's checksum is compared with the original's).
    order = np.lexsort((build_rows, probe_rows))
    return probe_rows[order], build_rows[order]


def _row_numbers(rows: int) -> pa.Array:
    # int32 where it fits: the build side's numbers are hashed with its keys and held.
    return pa.array(np.arange(rows, dtype=np.int32 if rows < 2**31 else np.int64))


def _one_chunk(batches: list[pa.RecordBatch], schema: pa.Schema) -> pa.Table:
    """`batches` as a table of one chunk per column, copied column by column, each column's
    pieces released once copied: the copy adds one column at a time, not the whole side.
    Empties `batches`."""
    columns = [[b.column(i) for b in batches] for i in range(len(schema))]
    batches.clear()
    whole: list[pa.Array] = []
    for i, field in enumerate(schema):
        pieces, columns[i] = columns[i], []
        whole.append(pa.concat_arrays(pieces) if pieces else pa.array([], field.type))
        del pieces
    return pa.Table.from_arrays(whole, schema=schema)


def _chunks(
    batches: Iterable[pa.RecordBatch], rows: int, nbytes: int, check: Callable[[], None]
) -> Iterator[pa.Table]:
    """`batches` gathered into tables of about `rows` rows, fewer if they reach `nbytes`."""
    held: list[pa.RecordBatch] = []
    held_rows = held_bytes = 0
    for batch in batches:
        check()
        held.append(batch)
        held_rows += batch.num_rows
        held_bytes += batch.nbytes
        if held_rows >= rows or held_bytes >= nbytes:
            yield pa.Table.from_batches(held).combine_chunks()
            held, held_rows, held_bytes = [], 0, 0
    if held:
        yield pa.Table.from_batches(held).combine_chunks()
