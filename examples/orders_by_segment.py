"""Orders by customer segment — run it with `tailguard run examples/orders_by_segment.py`.

A join with a broadcast side; the job lives in `tailguard.examples.orders_by_segment`:

    orders (Parquet) ────────────┐
                                 ├─ enrich (join on customer_id) -> partial sums
    customers (CSV) -> broadcast ┘      -> partition_by("segment") -> final sums (aggregate)
                                        -> Parquet sink
"""

from tailguard.examples.orders_by_segment import main

__all__ = ["main"]
