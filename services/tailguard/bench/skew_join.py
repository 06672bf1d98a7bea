"""The skew scenario's job (issue 27): orders joined to their customers, one customer hot.

The data: `SkewSize.splits` order files (one row group each: a task per file in both engines)
and one customer file. Order keys are spread evenly over `keys` customers, and one more customer
(`HOT_KEY`) has as many orders as `hot_factor - 1` average subpartitions hold, so its join
subpartition holds about `hot_factor` times the median one. Its orders are spread over every
file, as a hot key's rows are in real data, so each producer holds a piece of it.

The job: join the orders to their customers on `k` (an inner join, both sides hash-partitioned;
broadcast off in both engines, as for two large tables), then the I/O job's wait per joined row
(longer on a slowed host) and the revenue, then the revenue and order count per region. The wait
is after the join, so the subtask that reads the hot subpartition waits for all its rows: that is
what skew costs. Both engines split it with the same knobs lowered alike:

- tailguard: `table.optimizer.skewed-join-optimization.skewed-threshold` 0 (Flink's 256 MiB
  floor would leave a bench-sized key alone), the factor at Flink's 4, the join's subpartitions
  `SkewSize.subpartitions` (its max parallelism);
- Spark's AQE (`OptimizeSkewedJoin`, on by default): `skewedPartitionThresholdInBytes` 0, the
  factor at Spark's 5, `spark.sql.shuffle.partitions` the same count, the advisory partition
  size tailguard's `avg-data-volume-per-task`, and partition coalescing off (`spark_conf` says
  why).
"""

from __future__ import annotations

import functools
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from tailguard.bench import io_job
from tailguard.examples import sales_by_region as example

HOT_KEY = -1
JOIN_VERTEX = "enrich"
ORDERS, CUSTOMERS = "orders", "customers"


@dataclass(frozen=True)
class SkewSize:
    """`splits` order files of normal keys, `rows_per_subpartition` normal rows per join
    subpartition (on average), `hot_factor` the hot subpartition's rows over that, and
    `subpartition_s` the wait of an average subpartition's rows on a healthy host."""

    splits: int = 12
    subpartitions: int = 24
    keys: int = 400
    rows_per_subpartition: int = 1_500
    hot_factor: int = 20
    subpartition_s: float = 1.0

    @property
    def normal_rows(self) -> int:
        return self.subpartitions * self.rows_per_subpartition

    @property
    def hot_rows(self) -> int:
        # With its share of the normal keys, the hot subpartition holds about hot_factor times
        # an average one.
        return (self.hot_factor - 1) * self.rows_per_subpartition

    @property
    def row_s(self) -> float:
        return self.subpartition_s / self.rows_per_subpartition

    @property
    def work_s(self) -> float:
        """Every joined row's wait on a healthy host: the job's task-seconds of work."""
        return (self.normal_rows + self.hot_rows) * self.row_s


SKEW_SIZE = SkewSize()


def limit_s(size: SkewSize, hosts: int) -> float:
    """A lower bound on the join stage: the total wait over the hosts, and never below its
    largest indivisible piece (the hot subpartition cut along its producers: one piece per
    order file). The sources and the final aggregation are left out."""
    hot_piece = (size.hot_rows + size.rows_per_subpartition) / size.splits * size.row_s
    return max(size.work_s / hosts, hot_piece, size.subpartition_s)


def tailguard_settings() -> dict[str, str]:
    """The job's own settings (the services honour them for this job alone); the contender
    without splitting adds `STRATEGY_KEY` = none."""
    return {
        "table.optimizer.adaptive-broadcast-join.strategy": "none",
        "table.optimizer.skewed-join-optimization.skewed-threshold": "0",
    }


def spark_conf(size: SkewSize) -> dict[str, str]:
    """The session's SQL settings for the plain job: AQE's skew join on (Spark's default), its
    threshold lowered as tailguard's is, no broadcast, the same shuffle partitions as
    tailguard's subpartitions and the same target size as its decider.

    AQE's partition coalescing is off: Spark's best form of this job that we measured. With it
    on (at the 64 KiB advisory size, `parallelismFirst` false) Spark split the hot partition
    into 6 pieces but packed the 23 others into 2 tasks: the join stage ran 8 tasks, the
    longest 22 s, and the job took 29.9-33.5 s (3 runs, 2026-11-28); with its default
    `parallelismFirst` it packs to a 1 MiB minimum, coarser still. Off, the stage runs the 23
    partitions and the 6 pieces as 29 tasks of at most 4.5 s (18.6 s, one probe run)."""
    return {
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.adaptive.skewJoin.enabled": "true",
        "spark.sql.adaptive.skewJoin.skewedPartitionThresholdInBytes": "0",
        "spark.sql.autoBroadcastJoinThreshold": "-1",
        "spark.sql.shuffle.partitions": str(size.subpartitions),
        "spark.sql.adaptive.advisoryPartitionSizeInBytes": "64k",
        "spark.sql.adaptive.coalescePartitions.enabled": "false",
    }


def generate(path: Path, size: SkewSize, seed: int = 27) -> Path:
    """Write `path/orders/*.parquet` and `path/customers/customers.parquet`."""
    rng = np.random.default_rng(seed)
    orders, customers = path / ORDERS, path / CUSTOMERS
    shutil.rmtree(path, ignore_errors=True)
    orders.mkdir(parents=True)
    customers.mkdir(parents=True)
    normal = rng.integers(0, size.keys, size.normal_rows, dtype=np.int64)
    keys = np.concatenate([normal, np.full(size.hot_rows, HOT_KEY, dtype=np.int64)])
    rng.shuffle(keys)
    order_id = 0
    for f, chunk in enumerate(np.array_split(keys, size.splits)):
        n = len(chunk)
        table = pa.table(
            {
                "k": chunk,
                "order_id": np.arange(order_id, order_id + n, dtype=np.int64),
                "quantity": rng.integers(1, 20, size=n, dtype=np.int64),
                "price_cents": rng.integers(100, 50_000, size=n, dtype=np.int64),
            }
        )
        order_id += n
        pq.write_table(table, orders / f"orders-{f:04d}.parquet", row_group_size=n)
    ids = np.concatenate([np.arange(size.keys, dtype=np.int64), [HOT_KEY]])
    regions = rng.choice(example.REGIONS, size=len(ids))
    pq.write_table(
        pa.table({"k": ids, "region": regions.astype(str)}),
        customers / "customers.parquet",
    )
    return path


def reference(path: Path) -> pd.DataFrame:
    """The job's result by pandas: revenue and orders per region of the joined rows."""
    joined = pd.read_parquet(path / ORDERS).merge(pd.read_parquet(path / CUSTOMERS), on="k")
    return example.reference_of(joined)


def tailguard_job(path: Path, output: Path, size: SkewSize) -> Any:
    """The job as a tailguard graph: the join (its max parallelism the subpartition count), the
    wait per joined row chained to it, the sums per region in one task."""
    from tailguard.agent.graph.api import Job

    job = Job("orders-skew")
    orders = job.read_parquet(str(path / ORDERS), name=ORDERS)
    customers = job.read_parquet(str(path / CUSTOMERS), name=CUSTOMERS)
    joined = orders.join(
        customers, "k", "inner", name=JOIN_VERTEX, max_parallelism=size.subpartitions
    )
    # The I/O job's operator: the wait per row, then the partial sums per region.
    partial = joined.map_batches(
        functools.partial(
            io_job.partials, task_s=size.subpartition_s, rows_per_split=size.rows_per_subpartition
        ),
        name="io",
    )
    totals = partial.partition_by("region").map(example.final_sums, name="final", parallelism=1)
    totals.write_parquet(str(output), name="sink")
    return job


def plain_frame(spark: Any, path: Path, size: SkewSize) -> Any:
    """The job in PySpark's DataFrame API, up to its result (a DataFrame); sets the session's
    SQL settings (`spark_conf`) first."""
    from pyspark.sql import functions as F

    from tailguard.bench.plain_spark import FRAME_SCHEMA, ONE_FILE_PER_TASK, frame_scan

    for key, value in (ONE_FILE_PER_TASK, *spark_conf(size).items()):
        spark.conf.set(key, value)
    orders = spark.read.parquet(str(path / ORDERS))
    customers = spark.read.parquet(str(path / CUSTOMERS))
    rows = orders.join(customers, "k", "inner").mapInPandas(
        functools.partial(frame_scan, io_s_per_row=size.row_s), FRAME_SCHEMA
    )
    return rows.groupBy("region").agg(
        F.sum("revenue").alias("revenue"), F.count("order_id").alias("orders")
    )


def run_plain(spark: Any, path: Path, output: Path, size: SkewSize) -> int:
    """The plain job, written to `output`; its scan tasks (one per order file)."""
    plain_frame(spark, path, size).write.mode("overwrite").parquet(str(output))
    return size.splits


def warm_plain(spark: Any, path: Path, scratch: Path) -> None:
    """The plain job once without its waits, before the clock (as `plain_spark.warm_frame`):
    a new application's executors otherwise spend its first tasks loading the Parquet reader,
    Arrow and the generated code."""
    run_plain(spark, path, scratch, replace(SKEW_SIZE, subpartition_s=0.0))
    shutil.rmtree(scratch, ignore_errors=True)
