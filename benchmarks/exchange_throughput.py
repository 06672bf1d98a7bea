"""Data-plane throughput: partitioning, then result partitions written and read, interleaved
against the one-shot shape that came before streamed execution.

    .venv/bin/python benchmarks/exchange_throughput.py [--rows 1000000] [--subpartitions 128]
        [--batch-rows 10000] [--rounds 7]

Contenders, run once each per round in turn so that load changes hit them alike:

- write, one-shot (old): the whole output split at once, each subpartition encoded whole as an
  Arrow IPC file with per-buffer zstd in 64K-row batches (the writer before issue 15);
- write, streamed tables: today's `write_partition` of the same split tables;
- split+write, one-shot (old): `hash_partition` of the whole output, then the old write;
- split+write, streamed: what an attempt does, per batch of `--batch-rows` rows:
  `partition_batch` (one sort by subpartition) and `PartitionWriter.add`, then `finish`;
- read, old: every file hashed, then read again as an IPC file, batch by batch;
- read, one pass: today's `read_subpartitions` (hashed while decoded).

For each: median and spread (min-max) in ms, and Arrow's allocation peak (a proxy memory pool).
Prints figures, asserts nothing: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from itertools import count
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc

from tailguard.agent.executor.batches import compact
from tailguard.agent.executor.exchange import (
    hash_partition,
    partition_batch,
    round_robin_partition,
)
from tailguard.agent.executor.partitions import (
    PartitionWriter,
    read_subpartitions,
    subpartition_path,
    write_partition,
)
from tailguard.agent.executor.storage import Storage
from tailguard.model.records import PartitionRef

_OLD_BATCH_ROWS = 64 * 1024


def old_write(storage: Storage, ref: PartitionRef, tables: list[pa.Table]) -> list[str]:
    """The one-shot write before streaming: each subpartition encoded whole in memory, then
    written in one piece; returns the checksums."""
    sums = []
    for sp, table in enumerate(tables):
        canonical = pa.Table.from_batches([compact(table.to_batches(), table.schema)], table.schema)
        sink = pa.BufferOutputStream()
        options = pa.ipc.IpcWriteOptions(compression="zstd")
        with pa.ipc.new_file(sink, table.schema, options=options) as writer:
            writer.write_table(canonical, max_chunksize=_OLD_BATCH_ROWS)
        data = sink.getvalue()
        storage.write_atomic(subpartition_path(storage, "bench", ref, sp), data)
        sums.append(hashlib.blake2b(memoryview(data), digest_size=16).hexdigest())
    return sums


def old_read(storage: Storage, ref: PartitionRef, parts: int, sums: list[str]) -> int:
    """The read before this change: hash each whole file, then read it again batch by batch."""
    rows = 0
    for sp in range(parts):
        path = subpartition_path(storage, "bench", ref, sp)
        digest = hashlib.blake2b(digest_size=16)
        with storage.open_input(path) as f:
            while chunk := f.read(8 << 20):
                digest.update(chunk)
        assert digest.hexdigest() == sums[sp]
        with storage.open_input(path) as f:
            reader = pa.ipc.open_file(f)
            for i in range(reader.num_record_batches):
                rows += reader.get_batch(i).num_rows
    return rows


def streamed_split_write(
    storage: Storage, ref: PartitionRef, table: pa.Table, parts: int, batch_rows: int
) -> Any:
    writer = PartitionWriter(storage, "bench", ref, parts, batch_rows)
    for batch in table.to_batches(max_chunksize=batch_rows):
        writer.add(partition_batch(batch, parts, ["int_key"], 0))
    return writer.finish()


def measured(fn: Callable[[], Any]) -> tuple[float, float, int]:
    """Wall seconds and CPU seconds `fn` took, and the most bytes Arrow held at once while it
    ran. CPU time is given too because this machine's load swings: it is what the work costs
    whoever else runs."""
    base = pa.default_memory_pool()
    pool = pa.proxy_memory_pool(base)
    pa.set_memory_pool(pool)
    try:
        start, cpu = time.perf_counter(), time.process_time()
        fn()
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    finally:
        pa.set_memory_pool(base)
    _POOLS.append(pool)  # a pool must outlive the buffers it gave out
    return seconds, cpu, pool.max_memory()


_POOLS: list[Any] = []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--subpartitions", type=int, default=128)
    parser.add_argument("--batch-rows", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    n, parts = args.rows, args.subpartitions
    rng = np.random.default_rng(42)
    ints = rng.integers(0, 10**9, n)
    table = pa.table(
        {
            "int_key": ints,
            "str_key": pa.array(np.char.add("customer-", (ints % 1_000_000).astype(str))),
            "value": rng.random(n),
        }
    )
    mib = table.nbytes / 2**20
    print(f"{n:,} rows, {mib:.1f} MiB in memory, {parts} subpartitions")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")

    for label, fn in (
        ("hash, int64 key", lambda: hash_partition(table, ["int_key"], parts)),
        ("hash, string key", lambda: hash_partition(table, ["str_key"], parts)),
        ("hash, both keys", lambda: hash_partition(table, ["int_key", "str_key"], parts)),
        ("round robin", lambda: round_robin_partition(table, parts, offset=3)),
    ):
        seconds = min(measured(fn)[0] for _ in range(3))
        print(f"{label:<18} {seconds * 1000:8.1f} ms  {n / seconds / 1e6:6.1f} M rows/s")

    split = hash_partition(table, ["int_key"], parts)
    attempts = count()
    with tempfile.TemporaryDirectory() as root:
        storage = Storage(root)
        old_ref = PartitionRef("old", 0, 0)
        old_sums = old_write(storage, old_ref, split)
        new_ref = PartitionRef("new", 0, 0)
        new_sums = write_partition(storage, "bench", new_ref, split).checksums
        sums = {(0, sp): c for sp, c in enumerate(new_sums)}

        def new_read() -> None:
            got, _ = read_subpartitions(
                storage, "bench", "new", {0: 0}, (0, 0), (0, parts - 1), sums
            )
            assert got.num_rows == n

        contenders: dict[str, Callable[[], Any]] = {
            "write, one-shot (old)": lambda: old_write(
                storage, PartitionRef("o", 0, next(attempts)), split
            ),
            "write, streamed tables": lambda: write_partition(
                storage, "bench", PartitionRef("w", 0, next(attempts)), split
            ),
            "split+write, one-shot (old)": lambda: old_write(
                storage,
                PartitionRef("o", 0, next(attempts)),
                hash_partition(table, ["int_key"], parts),
            ),
            "split+write, streamed": lambda: streamed_split_write(
                storage, PartitionRef("s", 0, next(attempts)), table, parts, args.batch_rows
            ),
            "read, old (hash, then read)": lambda: old_read(storage, old_ref, parts, old_sums),
            "read, one pass": new_read,
        }
        times: dict[str, list[float]] = {name: [] for name in contenders}
        cpu_times: dict[str, list[float]] = {name: [] for name in contenders}
        peaks: dict[str, int] = dict.fromkeys(contenders, 0)
        for _ in range(args.rounds):
            for name, fn in contenders.items():
                seconds, cpu, peak = measured(fn)
                times[name].append(seconds * 1000)
                cpu_times[name].append(cpu * 1000)
                peaks[name] = max(peaks[name], peak)
            for ref_dir in ("o", "w", "s"):
                storage.delete_dir(storage.path("bench", "partitions", ref_dir))
        print(f"\n{args.rounds} interleaved rounds; batch size {args.batch_rows:,} rows")
        print(
            f"{'contender':<28} {'wall median':>11} {'min-max':>11} "
            f"{'CPU median':>10} {'min-max':>11} {'Arrow peak':>11}   (ms)"
        )
        for name, values in times.items():
            cpu_values = cpu_times[name]
            print(
                f"{name:<28} {statistics.median(values):11.0f} "
                f"{min(values):5.0f}-{max(values):<5.0f} {statistics.median(cpu_values):10.0f} "
                f"{min(cpu_values):5.0f}-{max(cpu_values):<5.0f} {peaks[name] / 2**20:7.1f} MiB"
            )
        new_size = sum(
            storage.size(subpartition_path(storage, "bench", new_ref, sp)) or 0
            for sp in range(parts)
        )
        old_size = sum(
            storage.size(subpartition_path(storage, "bench", old_ref, sp)) or 0
            for sp in range(parts)
        )
        print(f"on disk: old {old_size / 2**20:.1f} MiB, streamed {new_size / 2**20:.1f} MiB")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
