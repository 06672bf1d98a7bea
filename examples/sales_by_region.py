"""Sales by region — run it with `tailguard run examples/sales_by_region.py`.

The job itself lives in `tailguard.examples.sales_by_region` (shipped with the package, so the
demo and the benchmarks use the same code); this file is the runnable entry point:

    source (Parquet row groups) -> score -> partial sums
        -> partition_by("region") -> final sums -> Parquet sink

Params: --param files=8 --param rows=20000 --param work=0 (CPU rounds per row batch).
"""

from tailguard.examples.sales_by_region import main

__all__ = ["main"]
