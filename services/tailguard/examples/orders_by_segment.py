"""Orders by customer segment: a join with a broadcast side.

    orders (Parquet) ─────────────┐
                                  ├─ enrich (join on customer_id) -> partial sums
    customers (CSV) -> broadcast ─┘       -> partition_by("segment") -> final (aggregate: sums)
                                          -> Parquet sink

The join gets both inputs whole (`join`); the final sums stream (`aggregate`).

Run it with `tailguard run examples/orders_by_segment.py`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from tailguard.agent.graph.api import Job

SEGMENTS = ("consumer", "small-business", "enterprise", "public-sector", "education")


def generate(
    path: str | Path,
    customers: int = 500,
    files: int = 4,
    rows_per_file: int = 10_000,
    seed: int = 3,
) -> tuple[Path, Path]:
    path = Path(path)
    orders_dir, customers_dir = path / "orders", path / "customers"
    orders_dir.mkdir(parents=True, exist_ok=True)
    customers_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    pa_csv.write_csv(
        pa.table(
            {
                "customer_id": np.arange(customers, dtype=np.int64),
                "segment": rng.choice(SEGMENTS, size=customers),
            }
        ),
        customers_dir / "customers.csv",
    )
    for f in range(files):
        n = rows_per_file
        pq.write_table(
            pa.table(
                {
                    "order_id": np.arange(f * n, (f + 1) * n, dtype=np.int64),
                    "customer_id": rng.integers(0, customers, size=n, dtype=np.int64),
                    "amount_cents": rng.integers(100, 100_000, size=n, dtype=np.int64),
                }
            ),
            orders_dir / f"orders-{f:04d}.parquet",
            row_group_size=max(1, n // 2),
        )
    return orders_dir, customers_dir


def enrich(orders: pa.Table, customers: pa.Table) -> pa.Table:
    joined = orders.join(customers.select(["customer_id", "segment"]), "customer_id")
    if joined.num_rows == 0:
        return pa.table(
            {
                "segment": pa.array([], pa.string()),
                "amount": pa.array([], pa.int64()),
                "orders": pa.array([], pa.int64()),
            }
        )
    grouped = joined.group_by("segment").aggregate([("amount_cents", "sum"), ("order_id", "count")])
    return grouped.rename_columns({"amount_cents_sum": "amount", "order_id_count": "orders"})


def make_job(
    orders_path: str | Path,
    customers_path: str | Path,
    output_path: str | Path,
    name: str = "orders-by-segment",
) -> Job:
    job = Job(name)
    orders = job.read_parquet(str(orders_path), name="orders")
    customers = job.read_csv(str(customers_path), name="customers")
    partial = orders.join(customers.broadcast(), enrich, name="enrich")
    totals = partial.partition_by("segment").aggregate(
        amount=("amount", "sum"), orders=("orders", "sum"), name="final"
    )
    totals.write_parquet(str(output_path), name="sink")
    return job


def reference(orders_path: str | Path, customers_path: str | Path) -> pd.DataFrame:
    orders = pd.read_parquet(orders_path)
    customers = pd.read_csv(Path(customers_path) / "customers.csv")
    joined = orders.merge(customers, on="customer_id")
    return (
        joined.groupby("segment")
        .agg(amount=("amount_cents", "sum"), orders=("order_id", "count"))
        .reset_index()
        .sort_values("segment")
        .reset_index(drop=True)
    )


def read_output(output_path: str | Path) -> pd.DataFrame:
    frame = pq.read_table(str(output_path)).to_pandas()
    return frame.sort_values("segment").reset_index(drop=True)


def main(params: dict[str, Any]) -> Job:
    work_dir = Path(params.get("work_dir", "work"))
    data = work_dir / "data" / "orders_by_segment"
    orders_dir, customers_dir = data / "orders", data / "customers"
    if not orders_dir.exists():
        generate(data)
    return make_job(orders_dir, customers_dir, work_dir / "out" / "orders_by_segment")
