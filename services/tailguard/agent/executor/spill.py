"""Spill files by key hash: how an operator that must see more than a budget of rows at once
(group assembly, a join's build side) keeps bounded memory.

A stream is split by a hash of its keys into `SPILL_FANOUT` buckets, each an Arrow IPC stream in
a local spill file under the attempt's temporary directory, so a bucket holds every row of the
keys it got. Two streams spilled at the same level with the same keys put equal keys in buckets
of the same index (a join pairs them). A bucket still too large is split again at the next
level, with a hash mixed differently, up to `MAX_SPILL_LEVELS` levels. Used by `groups.py` and
`joins.py`; what is written is counted in the attempt's `SpillStats`.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from tailguard.agent.executor.batches import rebatch
from tailguard.agent.executor.exchange import key_hashes, remix

SPILL_FANOUT = 32
# The most rows worth split at once (see `spill_by_key`'s `rows_at_once`).
MAX_ROWS_AT_ONCE = SPILL_FANOUT * 1024
# A bucket split this many times is taken whole: every row left in it has one key (or keys
# whose hashes collide at every level), which no further split can separate.
MAX_SPILL_LEVELS = 4


@dataclass
class SpillStats:
    """What an attempt's operators spilled: Spark's per-task "spill (disk)" figure."""

    files: int = 0
    bytes: int = 0
    rows: int = 0


@dataclass(frozen=True)
class Bucket:
    """One spill file: the rows of one key-hash bucket, as an Arrow IPC stream."""

    path: str
    rows: int
    bytes: int
    level: int


def bucket_of(
    batch: pa.RecordBatch,
    keys: Sequence[str],
    level: int,
    nulls_anywhere: bool = False,
    nulls_before: int = 0,
) -> tuple[np.ndarray, int]:
    """Each row's bucket at `level` (int64 in [0, SPILL_FANOUT)), and how many rows have a
    null key. With `nulls_anywhere`, those rows are dealt round the buckets instead,
    continuing from the `nulls_before` dealt from earlier batches (so the deal does not depend
    on how the rows were batched): a join never matches them, and hashed they would all share
    one bucket that no split can make smaller."""
    hashes, has_null = key_hashes(pa.Table.from_batches([batch]), keys)
    # Another mix per level: the exchange already sent this subtask the rows of one residue of
    # the plain hash, and a bucket split again must spread over new buckets.
    buckets = (remix(hashes, level + 1) % np.uint64(SPILL_FANOUT)).astype(np.int64)
    nulls = int(has_null.sum())
    if nulls_anywhere and nulls:
        dealt = np.arange(nulls_before, nulls_before + nulls, dtype=np.int64)
        buckets[has_null] = dealt % SPILL_FANOUT
    return buckets, nulls


@dataclass(frozen=True)
class Spiller:
    """How one operator spills: by which keys, where, and what it tells its attempt."""

    keys: tuple[str, ...]
    # A directory removed with the operator (or the attempt).
    directory: str
    check: Callable[[], None]
    stats: SpillStats | None = None
    # Rows with a null key dealt round the buckets (`bucket_of`): for a join, never a group.
    nulls_anywhere: bool = False
    # Batches are joined into batches of this many rows (at most `MAX_ROWS_AT_ONCE`) before
    # they are split, as far as the caller's memory allows: a batch split writes one piece per
    # bucket, so small batches make tiny IPC messages, and a bucket read back in pieces of a
    # few rows and split again costs a Python round per piece (a 4M-row join side split twice,
    # from 10,000-row batches: 64 s; from 32,768-row ones: 10 s).
    rows_at_once: int = 1

    def spill(self, batches: Iterable[pa.RecordBatch], level: int = 0) -> dict[int, Bucket]:
        """Split `batches` into bucket files by key hash: bucket index -> its file, for the
        buckets that got rows. The files are removed by whoever reads them (`read_bucket`,
        `bucket_batches`, `discard_bucket`) or with the directory."""
        into = tempfile.mkdtemp(prefix=f"level{level}-", dir=self.directory)
        paths = [os.path.join(into, f"{b}.arrow") for b in range(SPILL_FANOUT)]
        rows = [0] * SPILL_FANOUT
        nulls = 0
        at_once = max(1, min(self.rows_at_once, MAX_ROWS_AT_ONCE))
        with contextlib.ExitStack() as stack:
            writers: dict[int, pa.ipc.RecordBatchStreamWriter] = {}
            for batch in rebatch(batches, at_once):
                self.check()
                if not batch.num_rows:
                    continue
                buckets, batch_nulls = bucket_of(
                    batch, self.keys, level, self.nulls_anywhere, nulls
                )
                nulls += batch_nulls
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
        spilled = {
            b: Bucket(paths[b], rows[b], os.path.getsize(paths[b]), level)
            for b in range(SPILL_FANOUT)
            if rows[b]
        }
        if self.stats is not None:
            self.stats.files += len(spilled)
            self.stats.bytes += sum(b.bytes for b in spilled.values())
            self.stats.rows += sum(b.rows for b in spilled.values())
        return spilled

    def split(self, bucket: Bucket) -> dict[int, Bucket]:
        """A bucket too large to take whole, split at the next level; its file is removed."""
        return self.spill(bucket_batches(bucket), bucket.level + 1)


def read_bucket(bucket: Bucket) -> pa.Table:
    """The bucket's rows as one table; its file is removed."""
    with pa.OSFile(bucket.path, "rb") as source:
        table = pa.ipc.open_stream(source).read_all()
    os.remove(bucket.path)
    return table


def bucket_batches(bucket: Bucket) -> Iterator[pa.RecordBatch]:
    """The bucket's rows batch by batch, as written; its file is removed once read."""
    with pa.OSFile(bucket.path, "rb") as source:
        yield from pa.ipc.open_stream(source)
    os.remove(bucket.path)


def discard_bucket(bucket: Bucket) -> None:
    """Remove a bucket nobody needs to read."""
    os.remove(bucket.path)
