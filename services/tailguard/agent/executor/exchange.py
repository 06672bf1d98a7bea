"""Splitting a producer's output into subpartitions: by key hash or round robin.

Both are deterministic across processes and runs, because a re-produced partition must hold the
same rows in the same subpartitions (its checksum is compared with the original's), and every
producer must send a key to the same consumer. Python's `hash()` of a str is salted per process,
so keys are hashed here with fixed 64-bit arithmetic over numpy views of the Arrow buffers
(a polynomial over the bytes for strings), vectorised: no Python work per row.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Rows whose key has a null go here: nulls are equal to each other for grouping, so they must
# land together, and no other row needs them.
NULL_KEY_SUBPARTITION = 0

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(h: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: every input bit affects every output bit (uint64 wraps)."""
    h = h ^ (h >> np.uint64(30))
    h = h * np.uint64(0xBF58476D1CE4E5B9)
    h = h ^ (h >> np.uint64(27))
    h = h * np.uint64(0x94D049BB133111EB)
    mixed: np.ndarray = h ^ (h >> np.uint64(31))
    return mixed


def _numeric_bits(column: pa.Array, as_type: pa.DataType) -> np.ndarray:
    filled = pc.fill_null(column.cast(as_type), pa.scalar(0, as_type))
    return np.asarray(filled.to_numpy(zero_copy_only=False))


def _hash_column(column: pa.Array) -> np.ndarray:
    """uint64 per row, equal for equal values whatever width or chunking the column has."""
    t = column.type
    if pa.types.is_dictionary(t):
        codes = np.asarray(pc.fill_null(column.indices, 0).to_numpy(zero_copy_only=False))
        return _hash_column(column.dictionary)[codes.astype(np.int64)]
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        # Widths are unified, so an int32 key and an int64 key from two producers agree.
        bits = _numeric_bits(column, pa.int64()).view(np.uint64)
        return _mix(bits)
    if pa.types.is_floating(t):
        values = _numeric_bits(column, pa.float64())
        # -0.0 == 0.0 and NaN == NaN for grouping: give them one bit pattern each.
        values = np.where(np.isnan(values), np.nan, values + 0.0)
        return _mix(values.view(np.uint64))
    if pa.types.is_temporal(t):
        storage_type = pa.int32() if t.bit_width == 32 else pa.int64()
        return _hash_column(pc.cast(column.view(storage_type), pa.int64()))
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return _hash_bytes(column)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return _hash_bytes(column)
    if pa.types.is_fixed_size_binary(t):
        return _hash_bytes(column.cast(pa.binary()))
    if pa.types.is_decimal(t):
        return _hash_bytes(column.cast(pa.string()))
    raise TypeError(f"cannot hash-partition on a key of type {t}")


_BYTE_MULTIPLIER = np.uint64(0x100000001B3)  # FNV-1's 64-bit prime, as a polynomial base
_powers = np.ones(1, dtype=np.uint64)


def _byte_powers(length: int) -> np.ndarray:
    """_BYTE_MULTIPLIER ** i for i < length (wrapping), grown on demand and kept."""
    global _powers
    if _powers.size < length:
        size = max(length, 2 * _powers.size)
        grown = np.full(size, _BYTE_MULTIPLIER, dtype=np.uint64)
        grown[0] = 1
        _powers = np.cumprod(grown, dtype=np.uint64)
    return _powers[:length]


# Up to this length, Horner's rule over byte positions (one pass over the rows per position)
# moves less memory than the whole-buffer method; both compute the same polynomial.
_HORNER_MAX_LENGTH = 48


def _polynomial_per_buffer(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """sum_j (byte_j + 1) * M**j per value, over the whole data buffer at once."""
    wide = data.astype(np.uint64)
    position = np.arange(wide.size, dtype=np.int64) - np.repeat(starts, lengths)
    terms = (wide + np.uint64(1)) * _byte_powers(int(lengths.max(initial=0)))[position]
    sums = np.zeros(lengths.size, dtype=np.uint64)
    nonempty = lengths > 0
    if wide.size:
        sums[nonempty] = np.add.reduceat(terms, starts[nonempty])
    return sums


def _polynomial_horner(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The same polynomial by Horner's rule, last byte first: step k adds byte len-1-k of
    every value longer than k, so a value's steps are contiguous from k = 0."""
    sums = np.zeros(lengths.size, dtype=np.uint64)
    ends = starts + lengths - 1
    for k in range(int(lengths.max(initial=0))):
        live = lengths > k
        index = np.maximum(ends - k, 0)  # rows that are not live read any valid byte
        byte = data[index].astype(np.uint64)
        byte += np.uint64(1)
        np.multiply(sums, _BYTE_MULTIPLIER, out=sums, where=live)
        np.add(sums, byte, out=sums, where=live)
    return sums


def _hash_bytes(column: pa.Array) -> np.ndarray:
    """A polynomial hash of each value's bytes, vectorised over the Arrow buffers (no Python
    object per row), then mixed with the value's length."""
    column = column.cast(pa.large_binary())
    n = len(column)
    _, offsets_buf, data_buf = column.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int64)[column.offset : column.offset + n + 1]
    first, last = int(offsets[0]), int(offsets[-1])
    data = (
        np.frombuffer(data_buf, dtype=np.uint8)[first:last]
        if data_buf is not None and last > first
        else np.zeros(0, dtype=np.uint8)
    )
    lengths = np.diff(offsets)
    starts = offsets[:-1] - first
    if data.size and int(lengths.max()) <= _HORNER_MAX_LENGTH:
        sums = _polynomial_horner(data, starts, lengths)
    else:
        sums = _polynomial_per_buffer(data, starts, lengths)
    return _mix(sums ^ _mix(lengths.astype(np.uint64) + _GOLDEN))


def key_hashes(table: pa.Table, keys: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(uint64 hash per row over `keys`, bool mask of rows with a null key)."""
    if not keys:
        raise ValueError("hash partitioning needs at least one key")
    combined = np.zeros(table.num_rows, dtype=np.uint64)
    has_null = np.zeros(table.num_rows, dtype=bool)
    for key in keys:
        column = table.column(key).combine_chunks()
        h = _hash_column(column)
        # boost's hash_combine, then a fresh mix, so (a, b) and (b, a) differ.
        combined = _mix(
            combined ^ (h + _GOLDEN + (combined << np.uint64(6)) + (combined >> np.uint64(2)))
        )
        if column.null_count:
            has_null |= np.asarray(column.is_null().to_numpy(zero_copy_only=False))
    return combined, has_null


def remix(hashes: np.ndarray, seed: int) -> np.ndarray:
    """`hashes` mixed again with `seed`: residues independent of the plain hash's (group
    assembly splits the rows one exchange subpartition received)."""
    offset = np.uint64((seed * int(_GOLDEN)) & 0xFFFF_FFFF_FFFF_FFFF)
    return _mix(hashes + offset)


def _hash_targets(table: pa.Table, keys: Sequence[str], n: int) -> np.ndarray:
    """The subpartition of each row of `table` by its `keys`' hash."""
    hashes, has_null = key_hashes(table, keys)
    targets = (hashes % np.uint64(n)).astype(np.int64)
    targets[has_null] = NULL_KEY_SUBPARTITION
    return targets


def _grouped_by(targets: np.ndarray, n: int) -> tuple[pa.Array, list[tuple[int, int]]]:
    """The row order that groups rows by target (stable: rows keep their input order within a
    target), and each target's (offset, length) in that order."""
    order = np.argsort(targets, kind="stable")
    counts = np.bincount(targets, minlength=n)
    starts = np.concatenate(([0], np.cumsum(counts)))
    return pa.array(order), [(int(starts[i]), int(counts[i])) for i in range(n)]


def hash_partition(table: pa.Table, keys: Sequence[str], n: int) -> list[pa.Table]:
    """Exactly `n` tables with `table`'s schema; rows with equal keys land in the same one.
    One take in target order, then zero-copy slices; rows keep their input order."""
    if n < 1:
        raise ValueError(f"need at least one subpartition, got {n}")
    if n == 1:
        return [table]
    order, spans = _grouped_by(_hash_targets(table, keys, n), n)
    grouped = table.take(order)
    return [grouped.slice(start, length) for start, length in spans]


def round_robin_partition(table: pa.Table, n: int, offset: int = 0) -> list[pa.Table]:
    """Exactly `n` contiguous slices whose sizes differ by at most one row (zero-copy).

    The larger slices start at subpartition `offset % n` and wrap around, so producers that
    pass their subtask index as `offset` spread small outputs over different consumers instead
    of all filling subpartition 0.
    """
    return [table.slice(start, length) for start, length in _round_robin_spans(table, n, offset)]


def _round_robin_spans(
    rows: pa.Table | pa.RecordBatch, n: int, offset: int
) -> list[tuple[int, int]]:
    """Each subpartition's (offset, length) in `rows` for `round_robin_partition`."""
    if n < 1:
        raise ValueError(f"need at least one subpartition, got {n}")
    base, extra = divmod(rows.num_rows, n)
    start = offset % n
    sizes = [base + (1 if (sp - start) % n < extra else 0) for sp in range(n)]
    # Rows are laid out in subpartition order starting at `start`, so each slice is contiguous.
    spans = [(0, 0)] * n
    position = 0
    for step in range(n):
        sp = (start + step) % n
        spans[sp] = (position, sizes[sp])
        position += sizes[sp]
    return spans


def partition_batch(
    batch: pa.RecordBatch, n: int, keys: Sequence[str], offset: int
) -> list[pa.RecordBatch]:
    """One batch of a producer's output split into `n` pieces, one per subpartition: by key hash
    when `keys` are given, else round robin with the larger pieces starting at `offset` (a
    producer passes its subtask index plus the rows it has split so far, so its batches spread
    their extra rows over every subpartition in turn).

    The pieces are zero-copy slices of one batch: the input itself for round robin, and for a
    key hash one `take` that orders the rows by subpartition (stably, so each piece keeps the
    input's row order). A copy per piece would cost a Python call per column per subpartition
    per batch, which dominated wide exchanges (128 subpartitions)."""
    if n < 1:
        raise ValueError(f"need at least one subpartition, got {n}")
    if n == 1:
        return [batch]
    if not keys:
        return [
            batch.slice(start, length) for start, length in _round_robin_spans(batch, n, offset)
        ]
    order, spans = _grouped_by(_hash_targets(pa.Table.from_batches([batch]), keys, n), n)
    grouped = batch.take(order)
    return [grouped.slice(start, length) for start, length in spans]
