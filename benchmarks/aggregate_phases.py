"""Two-phase aggregation against one phase, on a job with one hot key.

    .venv/bin/python benchmarks/aggregate_phases.py [--files 8] [--rows 1000000]
        [--hot 0.8] [--keys 20000] [--rounds 3]

The job: `--files` Parquet files (one source subtask each) of `--rows` rows, a fraction `--hot`
of them with one key and the rest over `--keys` keys; `partition_by("k").aggregate(...)` (a sum,
a row count and a mean); a Parquet sink. Contenders, run in turn every round on one Spark session
on `local[2]` (two slot runners) so load changes hit them alike:

- `TWO_PHASE` (the default, `table.optimizer.agg-phase-strategy` AUTO): the producers write
  partial states, the consumers merge them;
- `ONE_PHASE`: the producers write rows; the subtask that gets the hot key aggregates all of it.

Every output is checked against pandas `groupby` (floats to 1e-12). Printed per contender: job
time (median, min-max), the bytes that crossed the exchange, the largest subpartition over the
median (the skew the decider sees), the consumer subtasks, and work over the 2 slots (the sum of
the winning attempts' times / 2, the job's bound with perfect packing). Also the load average.
Asserts nothing about time: figures depend on the machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))

from interleaved import run_rounds, written
from tailguard.agent.driver.result import RunResult
from tailguard.agent.graph.api import Job

STRATEGIES = ("TWO_PHASE", "ONE_PHASE")


def write_data(path: Path, files: int, rows: int, hot: float, keys: int) -> Path:
    rng = np.random.default_rng(27)
    path.mkdir(parents=True)
    hot_rows = int(rows * hot)
    for f in range(files):
        k = np.concatenate([np.full(hot_rows, keys), rng.integers(0, keys, rows - hot_rows)])
        rng.shuffle(k)
        table = pa.table({"k": k, "qty": rng.integers(0, 100, rows), "x": rng.random(rows)})
        pq.write_table(table, path / f"part-{f:03d}.parquet")
    return path


def reference(data: Path) -> pd.DataFrame:
    whole = pq.read_table(data).to_pandas()
    return (
        whole.groupby("k")
        .agg(total=("qty", "sum"), rows=("qty", "size"), mean_x=("x", "mean"))
        .reset_index()
    )


def job(data: Path, out: Path, files: int) -> Job:
    j = Job("aggregate-phases")
    j.read_parquet(str(data), name="src", parallelism=files).partition_by("k").aggregate(
        total=("qty", "sum"), rows=("*", "count"), mean_x=("x", "mean"), name="agg"
    ).write_parquet(str(out), name="sink")
    return j


def check(out: Path, expected: pd.DataFrame) -> None:
    got = pq.read_table(out).to_pandas().sort_values("k", ignore_index=True)
    pd.testing.assert_frame_equal(
        got[list(expected.columns)], expected, check_exact=False, rtol=1e-12, check_dtype=False
    )


def exchange_figures(archive: str) -> tuple[int, float]:
    """Bytes the producers wrote, and the largest subpartition over the median."""
    sizes = sorted(sum(column) for column in zip(*written(archive, "src"), strict=True))
    return sum(sizes), sizes[-1] / max(sizes[len(sizes) // 2], 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows per file")
    parser.add_argument("--hot", type=float, default=0.8, help="the hot key's share of rows")
    parser.add_argument("--keys", type=int, default=20_000, help="the other keys")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if not 0 <= args.hot < 1 or min(args.files, args.rows, args.keys, args.rounds) < 1:
        parser.error("need --hot in [0, 1) and positive --files, --rows, --keys, --rounds")

    work = Path(tempfile.mkdtemp(prefix="tailguard-agg-phases-"))
    print(f"writing {args.files} x {args.rows:,} rows ({args.hot:.0%} one key) to {work}")
    data = write_data(work / "in", args.files, args.rows, args.hot, args.keys)
    expected = reference(data)

    def measure(result: RunResult, seconds: float) -> dict[str, Any]:
        assert result.archive is not None
        exchanged, skew = exchange_figures(result.archive)
        won = [a.duration_ms for a in result.attempts if a.won]
        return {
            "s": seconds,
            "exchanged": exchanged,
            "skew": skew,
            "consumers": result.parallelism.get("agg→sink", (0, ""))[0],
            "bound_s": sum(won) / 1000 / 2,
        }

    measured = run_rounds(
        "bench-aggregate-phases",
        work,
        args.rounds,
        {s: {"table.optimizer.agg-phase-strategy": s} for s in STRATEGIES},
        lambda out: job(data, out, args.files),
        lambda out: check(out, expected),
        measure,
    )
    if measured is None:
        return 1
    figures = measured.figures
    print(
        f"\n{args.files} files x {args.rows:,} rows, {args.hot:.0%} one key, {args.keys:,} other "
        f"keys; local[2]; {args.rounds} rounds; outputs equal to pandas groupby"
    )
    print(
        f"{'contender':<10} {'job s (min-max)':<20} {'exchanged':>10} {'max/median':>10} "
        f"{'consumers':>9} {'work/2 slots':>13}"
    )
    for strategy, runs in figures.items():
        print(
            f"{strategy:<10} {measured.seconds(strategy, lambda x: x['s'])}"
            f"{'':4} {statistics.median(x['exchanged'] for x in runs) / 1e6:8.1f} MB"
            f" {statistics.median(x['skew'] for x in runs):9.1f}x"
            f" {statistics.median(x['consumers'] for x in runs):9.0f}"
            f" {statistics.median(x['bound_s'] for x in runs):11.2f} s"
        )
    measured.footer(lambda x: float(x["s"]), "aggregate_phases.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
