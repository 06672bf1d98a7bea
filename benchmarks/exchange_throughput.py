"""Data-plane throughput: hash / round-robin partitioning, partition write and verified read.

    .venv/bin/python benchmarks/exchange_throughput.py [--rows 1000000] [--subpartitions 128]

Prints figures, asserts nothing: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import pyarrow as pa

from tailguard.agent.executor.exchange import hash_partition, round_robin_partition
from tailguard.agent.executor.partitions import read_subpartitions, write_partition
from tailguard.agent.executor.storage import Storage
from tailguard.model.records import PartitionRef

T = TypeVar("T")


def best_of(runs: int, fn: Callable[[], T]) -> tuple[float, T]:
    best = float("inf")
    result: T | None = None
    for _ in range(runs):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    assert result is not None
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--subpartitions", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3)
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

    for label, fn in (
        ("hash, int64 key", lambda: hash_partition(table, ["int_key"], parts)),
        ("hash, string key", lambda: hash_partition(table, ["str_key"], parts)),
        ("hash, both keys", lambda: hash_partition(table, ["int_key", "str_key"], parts)),
        ("round robin", lambda: round_robin_partition(table, parts, offset=3)),
    ):
        seconds, _ = best_of(args.runs, fn)
        print(f"{label:<18} {seconds * 1000:8.1f} ms  {n / seconds / 1e6:6.1f} M rows/s")

    split = hash_partition(table, ["int_key"], parts)
    with tempfile.TemporaryDirectory() as root:
        storage = Storage(root)
        attempt = iter(range(1_000_000))
        seconds, written = best_of(
            args.runs,
            lambda: write_partition(storage, "bench", PartitionRef("p", 0, next(attempt)), split),
        )
        on_disk = sum(written.bytes_per_subpartition) / 2**20
        print(
            f"{'write partition':<18} {seconds * 1000:8.1f} ms  {mib / seconds:6.1f} MiB/s"
            f"  ({on_disk:.1f} MiB on disk, zstd)"
        )
        last = next(attempt) - 1
        sums = {(0, sp): c for sp, c in enumerate(written.checksums)}
        seconds, (read, read_bytes) = best_of(
            args.runs,
            lambda: read_subpartitions(
                storage, "bench", "p", {0: last}, (0, 0), (0, parts - 1), sums
            ),
        )
        assert read.num_rows == n
        print(
            f"{'verified read':<18} {seconds * 1000:8.1f} ms  {mib / seconds:6.1f} MiB/s"
            f"  ({read_bytes / 2**20:.1f} MiB read)"
        )


if __name__ == "__main__":
    main()
