"""The adaptive broadcast join: a join whose small side is known only at run time, broadcast with
its large side run inside the join's subtasks, against the same join shuffled.

    .venv/bin/python benchmarks/broadcast_join.py [--files 8] [--rows 1000000] [--rounds 3]

The job: `--files` Parquet files (one source subtask each) of `--rows` rows (a key over 100,000
values and two payload columns), left-joined on the key with a 100,000-row dimension table that
a filter cuts to 1% (so its size is known only once produced), into a Parquet sink. Contenders,
run in turn every round on one Spark session on `local[2]` (two slot runners), so load changes
hit them alike:

- `broadcast` (the default, `table.optimizer.adaptive-broadcast-join.strategy` auto): the
  filtered side is produced first, the join is decided broadcast, and the large side runs inside
  the join's subtasks (nothing of it written);
- `shuffled` (the strategy `none`): the large side is hash-partitioned on the key, written,
  and read back by the join's subtasks.

Every output is checked against pandas `merge`. Printed per contender: job time (median,
min-max), the bytes the large side wrote, the join's subtasks, and work over the 2 slots (the
sum of the winning attempts' times / 2, the job's bound with perfect packing). Also the load
average. Asserts nothing about time: figures depend on the machine.

Run with `PYTHONPATH=<an older tree>/services` to measure an older build the same way.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))

from interleaved import run_rounds, written
from tailguard.agent.driver.result import RunResult
from tailguard.agent.graph.api import Job

CONTENDERS = {"broadcast": "auto", "shuffled": "none"}
DIM_KEYS = 100_000
KEPT_KEYS = DIM_KEYS // 100  # the filter keeps 1% of the dimension table
JOIN = "enrich→sink"


def write_data(path: Path, files: int, rows: int) -> tuple[Path, Path]:
    rng = np.random.default_rng(470)
    large = path / "large"
    large.mkdir(parents=True)
    for f in range(files):
        table = pa.table(
            {
                "k": rng.integers(0, DIM_KEYS, rows),
                "qty": rng.integers(0, 100, rows),
                "x": rng.random(rows),
            }
        )
        pq.write_table(table, large / f"part-{f:03d}.parquet")
    dims = path / "dims"
    dims.mkdir()
    keys = np.arange(DIM_KEYS)
    pq.write_table(
        pa.table({"k": keys, "region": keys % 97, "weight": rng.random(DIM_KEYS)}),
        dims / "dims.parquet",
    )
    return large, dims


def keep_few(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch.filter(pc.less(batch["k"], KEPT_KEYS))


def job(large: Path, dims: Path, out: Path, files: int) -> Job:
    j = Job("broadcast-join")
    facts = j.read_parquet(str(large), name="large", parallelism=files)
    small = j.read_parquet(str(dims), name="dims").map_batches(keep_few, name="few")
    facts.join(small, "k", "left", name="enrich").write_parquet(str(out), name="sink")
    return j


def reference(large: Path, dims: Path) -> pd.DataFrame:
    d = pq.read_table(dims).to_pandas()
    merged = pq.read_table(large).to_pandas().merge(d[d["k"] < KEPT_KEYS], on="k", how="left")
    return _ordered(merged)


def _ordered(frame: pd.DataFrame) -> pd.DataFrame:
    columns = ["k", "qty", "x", "region", "weight"]
    return frame[columns].sort_values(columns, ignore_index=True)


def check(out: Path, expected: pd.DataFrame) -> None:
    got = _ordered(pq.read_table(out).to_pandas())
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)


def large_side_written(archive: str) -> int:
    """The bytes the large side's attempts wrote to result partitions (none when fused)."""
    return sum(sum(sizes) for sizes in written(archive, "large"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows per large file")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if min(args.files, args.rows, args.rounds) < 1:
        parser.error("need positive --files, --rows and --rounds")

    work = Path(tempfile.mkdtemp(prefix="tailguard-broadcast-join-"))
    print(f"writing {args.files} x {args.rows:,} rows and {DIM_KEYS:,} dimension rows to {work}")
    large, dims = write_data(work / "in", args.files, args.rows)
    expected = reference(large, dims)

    def measure(result: RunResult, seconds: float) -> tuple[float, int, int, float]:
        assert result.archive is not None
        won = [a.duration_ms for a in result.attempts if a.won]
        return (
            seconds,
            large_side_written(result.archive),
            result.parallelism.get(JOIN, (0, ""))[0],
            sum(won) / 1000 / 2,
        )

    measured = run_rounds(
        "bench-broadcast-join",
        work,
        args.rounds,
        {c: {"table.optimizer.adaptive-broadcast-join.strategy": s} for c, s in CONTENDERS.items()},
        lambda out: job(large, dims, out, args.files),
        lambda out: check(out, expected),
        measure,
    )
    if measured is None:
        return 1
    runs = measured.figures
    print(
        f"\n{args.files} files x {args.rows:,} rows left-joined with {KEPT_KEYS:,} of "
        f"{DIM_KEYS:,} dimension rows; local[2]; {args.rounds} rounds; outputs equal to pandas "
        "merge"
    )
    print(
        f"{'contender':<10} {'job s (min-max)':<20} {'large side written':>18} "
        f"{'join subtasks':>13} {'work/2 slots':>13}"
    )
    for contender, figures in runs.items():
        print(
            f"{contender:<10} {measured.seconds(contender, lambda f: f[0])}"
            f"{'':4} {statistics.median(f[1] for f in figures) / 1e6:15.1f} MB"
            f" {statistics.median(f[2] for f in figures):13.0f}"
            f" {statistics.median(f[3] for f in figures):11.2f} s"
        )
    measured.footer(lambda f: f[0], "broadcast_join.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
