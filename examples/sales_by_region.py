"""Sales by region — run it with `tailguard run examples/sales_by_region.py`.

The job itself lives in `tailguard.examples.sales_by_region` (shipped with the package, so the
demo and the benchmarks use the same code); this file is the runnable entry point:

    source (Parquet row groups) -> score (map_batches) -> partial sums (map_in_arrow)
        -> partition_by("region") -> final sums (aggregate) -> Parquet sink

Every operator streams record batches of the `python.fn-execution.arrow.batch.size` setting.

Params: --param files=8 --param rows=20000 --param work=0 (CPU rounds per row batch).
"""

from tailguard.examples.sales_by_region import main

__all__ = ["main"]
