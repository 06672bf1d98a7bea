"""The I/O-mode job's operator, shared by the tailguard graph and the plain PySpark job.

`partials(table, task_s, rows_per_split)` waits `task_s` healthy-host seconds per split's worth
of rows on its host (`slowness.io_work`: longer on a slowed host), then computes the sales job's
partial sums (revenue per region, exact integers), so the output can be checked against the
pandas reference; `waited` is the wait alone, for the stages of a job with several
(`IoSize.stages`). The wait is proportional to the rows it is given, so the work is the same
whether a task gets one split, several, or a split in batches.
"""

from __future__ import annotations

import pyarrow as pa

from tailguard.examples import sales_by_region as example


def waited(table: pa.Table | pa.RecordBatch, task_s: float, rows_per_split: int) -> pa.Table:
    """The rows, after their wait: the work of a stage before a further exchange. A record
    batch (tailguard's `map_batches`, batch by batch as read) or a whole table (Spark's
    `mapPartitions`, the split at once): the wait is per row, so the work is the same."""
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    # The sales example's I/O-bound work: a cancelled tailguard attempt ends its wait at once.
    return example.fetch(table, task_s / rows_per_split)


def partials(table: pa.Table | pa.RecordBatch, task_s: float, rows_per_split: int) -> pa.Table:
    return example.partial_sums(example.score(waited(table, task_s, rows_per_split), 0))
