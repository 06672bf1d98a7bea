"""Revenue per country from the day's orders: a tailguard job as a platform team writes one.

    orders (Parquet) -> price: net revenue per order, batch by batch (map_in_pandas)
        -> partition_by("country") -> revenue and order count per country (aggregate)
        -> Parquet sink

`price` has PySpark's `mapInPandas` shape (an iterator of DataFrames in, one out), so the same
function also runs in a PySpark job. Run it with
`tailguard run jobs/country_revenue.py --param orders=data/orders`; test it with `pytest`
(tests/test_country_revenue.py, with tailguard's pytest plugin).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import tailguard


def price(batches: Iterator[pd.DataFrame], rounds: int = 0) -> Iterator[pd.DataFrame]:
    """Net revenue per order: a refunded order counts 0. `rounds` of a risk score per row
    stand for the model a real job runs here (CPU work, which a slow host slows down)."""
    for orders in batches:
        risk = orders["amount_cents"].to_numpy(dtype=np.float64)
        for _ in range(rounds):
            risk = np.sqrt(risk * risk + 1.0)
        net = orders["amount_cents"].where(~orders["refunded"], 0).astype("int64")
        yield pd.DataFrame({"country": orders["country"], "net_cents": net})


def build_job(orders: str | Path, out: str | Path, rounds: int = 0) -> tailguard.Job:
    job = tailguard.Job("country-revenue")
    source = job.read_parquet(str(orders), name="orders")
    priced = source.map_in_pandas(functools.partial(price, rounds=rounds), name="price")
    per_country = priced.partition_by("country").aggregate(
        net_cents=("net_cents", "sum"), orders=("*", "count"), name="totals"
    )
    per_country.write_parquet(str(out), name="sink")
    return job


def main(params: dict[str, Any]) -> tailguard.Job:
    """Entry point for `tailguard run`."""
    work = Path(params.get("work_dir", "work"))
    return build_job(
        params.get("orders", "data/orders"),
        params.get("out", work / "out" / "country_revenue"),
        rounds=int(params.get("rounds", 0)),
    )
