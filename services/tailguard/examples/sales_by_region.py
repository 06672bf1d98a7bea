"""Sales by region: a two-stage aggregation on generated data.

    source (Parquet row groups) -> score (map_batches: revenue per row, the work per batch)
        -> partial (map_in_arrow: sums per region over the subtask's batches)
        -> partition_by("region") -> final (aggregate: sums) -> Parquet sink

Every operator streams record batches: a subtask holds a few batches, not its input.

The work per batch is CPU work (`work`: rounds of numpy over the rows), I/O-bound work
(`io_s_per_row`: a wait per row, as a lookup per order in a remote store would be), or both.
On a cluster with more executors than cores only the I/O-bound kind can be slowed honestly on
one host (`tailguard cluster throttle --mode io`, docs/cluster.md): `tailguard demo` and the
suites with a slow host use it.

Run it with `tailguard run examples/sales_by_region.py` (generates its data under work/ first),
or import `make_job` / `generate` / `reference` from tests and benchmarks.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tailguard.agent.executor.control import wait
from tailguard.agent.graph.api import Job
from tailguard.cluster.slowness import io_work

Rows = TypeVar("Rows", pa.Table, pa.RecordBatch)
REGIONS = ("north", "south", "east", "west", "central", "coast", "mountain", "islands")


def generate(
    path: str | Path,
    files: int = 8,
    rows_per_file: int = 20_000,
    row_groups_per_file: int = 2,
    seed: int = 7,
    skew: float = 0.0,
) -> Path:
    """Write the sales data set; `skew` > 0 makes the first region that many times larger."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    weights = np.ones(len(REGIONS))
    weights[0] += skew
    weights /= weights.sum()
    for f in range(files):
        n = rows_per_file
        table = pa.table(
            {
                "order_id": np.arange(f * n, (f + 1) * n, dtype=np.int64),
                "region": rng.choice(REGIONS, size=n, p=weights),
                "quantity": rng.integers(1, 20, size=n, dtype=np.int64),
                # Cents, so sums are exact whatever the order of addition.
                "price_cents": rng.integers(100, 50_000, size=n, dtype=np.int64),
            }
        )
        pq.write_table(
            table, path / f"sales-{f:04d}.parquet", row_group_size=max(1, n // row_groups_per_file)
        )
    return path


def score(table: pa.Table | pa.RecordBatch, work: int = 0) -> pa.Table | pa.RecordBatch:
    """Revenue per row, plus `work` rounds of fixed CPU work over the rows (stands in for the
    real Python work of a job; it slows down on a throttled node, unlike a sleep). Takes a
    table or a record batch and returns the same kind."""
    revenue = pc.multiply(table["quantity"], table["price_cents"])
    acc = revenue.to_numpy(zero_copy_only=False).astype(np.float64)
    for _ in range(work):
        acc = np.sqrt(acc * acc + 1.0)
    return table.append_column("revenue", revenue)


def fetch(table: Rows, io_s_per_row: float) -> Rows:
    """The rows, after `io_s_per_row` seconds of I/O-bound work per row as a healthy host does
    it (`slowness.io_work`: `factor` times longer on a host slowed in io mode). A cancelled
    tailguard attempt stops waiting at once; in plain Spark it is a sleep."""
    if io_s_per_row > 0 and table.num_rows:
        io_work(io_s_per_row * table.num_rows, wait=wait)
    return table


def partial_sums(table: pa.Table) -> pa.Table:
    if table.num_rows == 0:
        return pa.table(
            {
                "region": pa.array([], pa.string()),
                "revenue": pa.array([], pa.int64()),
                "orders": pa.array([], pa.int64()),
            }
        )
    grouped = table.group_by("region").aggregate([("revenue", "sum"), ("order_id", "count")])
    return grouped.rename_columns({"revenue_sum": "revenue", "order_id_count": "orders"})


def partial_sums_of_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """`partial_sums` over a subtask's stream of batches (`map_in_arrow`): each batch is summed
    as it comes, and the sums per region are combined at the end, so the subtask holds one row
    per region and batch seen, never its rows."""
    sums = [partial_sums(pa.Table.from_batches([batch])) for batch in batches]
    combined = pa.concat_tables(sums) if sums else partial_sums(pa.table({}))
    if combined.num_rows:
        combined = combined.group_by("region", use_threads=False).aggregate(
            [("revenue", "sum"), ("orders", "sum")]
        )
        combined = combined.rename_columns({"revenue_sum": "revenue", "orders_sum": "orders"})
    yield from combined.to_batches()


def final_sums(table: pa.Table) -> pa.Table:
    if table.num_rows == 0:
        return table
    grouped = table.group_by("region").aggregate([("revenue", "sum"), ("orders", "sum")])
    return grouped.rename_columns({"revenue_sum": "revenue", "orders_sum": "orders"}).sort_by(
        "region"
    )


def make_job(
    input_path: str | Path,
    output_path: str | Path,
    work: int = 0,
    name: str = "sales-by-region",
    io_s_per_row: float = 0.0,
) -> Job:
    """The job; `work` is the CPU work per row (`score`), `io_s_per_row` the I/O-bound wait
    per row before it (`fetch`)."""
    job = Job(name)
    sales = job.read_parquet(str(input_path), name="sales")
    scored = sales.map_batches(lambda batch: score(fetch(batch, io_s_per_row), work), name="score")
    partial = scored.map_in_arrow(partial_sums_of_batches, name="partial")
    totals = partial.partition_by("region").aggregate(
        revenue=("revenue", "sum"), orders=("orders", "sum"), name="final"
    )
    totals.write_parquet(str(output_path), name="sink")
    return job


def reference(input_path: str | Path) -> pd.DataFrame:
    """The same result computed by pandas, for checking."""
    return reference_of(pd.read_parquet(input_path))


def reference_of(frame: pd.DataFrame) -> pd.DataFrame:
    """The job's result by pandas over `frame`'s orders (region, quantity, price_cents,
    order_id): revenue and orders per region, sorted by region."""
    frame = frame.assign(revenue=frame["quantity"] * frame["price_cents"])
    out = (
        frame.groupby("region")
        .agg(revenue=("revenue", "sum"), orders=("order_id", "count"))
        .reset_index()
        .sort_values("region")
        .reset_index(drop=True)
    )
    return out


def read_output(output_path: str | Path) -> pd.DataFrame:
    frame = pq.read_table(str(output_path)).to_pandas()
    return frame.sort_values("region").reset_index(drop=True)


def main(params: dict[str, Any]) -> Job:
    """Entry point for `tailguard run`: generates the data under the work dir if missing."""
    work_dir = Path(params.get("work_dir", "work"))
    data = work_dir / "data" / "sales"
    if not data.exists():
        generate(
            data, files=int(params.get("files", 8)), rows_per_file=int(params.get("rows", 20_000))
        )
    return make_job(
        data,
        work_dir / "out" / "sales_by_region",
        work=int(params.get("work", 0)),
        io_s_per_row=float(params.get("io_s_per_row", 0.0)),
    )
