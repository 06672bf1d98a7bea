"""The benchmark jobs written as plain PySpark, for the Spark contenders.

Formulation: an RDD over the same splits tailguard reads (one partition per Parquet row group,
in the same order), with Arrow tables inside each partition. This is the fastest honest form we
found for this work: the CPU work is vectorised numpy on whole row groups, as in tailguard, with
no per-row Python. `spark.read.parquet` would pack these small files into one or two partitions
(`spark.sql.files.maxPartitionBytes` is 128 MiB), i.e. no parallelism at all, and a pandas UDF
adds a JVM -> Arrow -> pandas round trip per batch for nothing. Same source files, same `score`,
same aggregation (`partial_sums` per split, `final_sums` per key), same output check.

The I/O job is the sales job with the CPU work replaced by `io_job.partials`: per split, a wait
scaled by the host's slowness factor, then the partial sums; the same function tailguard runs.

The I/O job in the DataFrame API (`run_frame_job`, shape "io-frame") is the form attach mode
is for, and what `make bench-attach` runs: `spark.read.parquet` -> `mapInPandas` (the same
wait per row, then the revenue column) -> `groupBy("region").agg` -> Parquet. Its reads and
its shuffle are Spark's own, so Spark's input and shuffle metrics exist, which the slow-host
rule and the decider read.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
import time
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tailguard.agent.executor.exchange import round_robin_partition
from tailguard.bench import io_job
from tailguard.bench.report import SparkTask, StageWork, lost_copy_s, spark_stage_work
from tailguard.cluster import slowness
from tailguard.examples import sales_by_region as example

Split = tuple[str, int]  # (file, row group)


def list_splits(data: Path) -> list[Split]:
    """One split per row group, files in name order: the order tailguard's source uses."""
    splits: list[Split] = []
    for path in sorted(data.glob("*.parquet")):
        groups = pq.ParquetFile(path).metadata.num_row_groups
        splits.extend((str(path), g) for g in range(groups))
    return splits


def session_builder(master: str, app_name: str, conf: Iterable[tuple[str, str]]) -> Any:
    """A plain SparkSession: Spark's defaults except what a local standalone cluster needs."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.pyspark.python", sys.executable)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
    )
    for key, value in conf:
        builder = builder.config(key, value)
    return builder


def _warm(host: str) -> str:
    # Importing these and running `score` once is the Python-side start-up of a task.
    import tailguard.agent.executor.attempt  # noqa: F401

    example.score(pa.table({"quantity": [1], "price_cents": [1]}), 1)
    return os.environ.get("SPARK_LOCAL_IP", host)


def warm_up(sc: Any, hosts: list[str]) -> list[str]:
    """Start every executor's Python worker before the clock starts, the same for every
    contender: what is measured is the job, not the Python start-up of a fresh session."""
    from tailguard.cluster.pinning import pinned_rdd

    return sorted(pinned_rdd(sc, [(h, h) for h in hosts]).map(_warm).collect())


def _slowness_env(host: str) -> tuple[str, str | None, float]:
    return (
        os.environ.get("SPARK_LOCAL_IP", host),
        os.environ.get(slowness.ENV_VAR),
        slowness.host_factor(),
    )


def probe_slowness(sc: Any, hosts: list[str]) -> dict[str, tuple[str | None, float]]:
    """Per host, as a task there sees it: the slowness file it reads and its factor now."""
    from tailguard.cluster.pinning import pinned_rdd

    seen = pinned_rdd(sc, [(h, h) for h in hosts]).map(_slowness_env).collect()
    return {host: (path, factor) for host, path, factor in seen}


def _read(split: Split) -> pa.Table:
    return pq.ParquetFile(split[0]).read_row_group(split[1])


def _sums_rows(table: pa.Table) -> Iterator[tuple[str, tuple[int, int]]]:
    for row in table.to_pylist():
        yield row["region"], (int(row["revenue"]), int(row["orders"]))


def _score_partials(splits: Iterator[Split], work: int) -> Iterator[tuple[str, tuple[int, int]]]:
    for split in splits:
        yield from _sums_rows(example.partial_sums(example.score(_read(split), work)))


def _io_partials(
    splits: Iterator[Split], task_s: float, rows_per_split: int
) -> Iterator[tuple[str, tuple[int, int]]]:
    for split in splits:
        yield from _sums_rows(io_job.partials(_read(split), task_s, rows_per_split))


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def _round_robin(tables: Iterable[pa.Table], n: int, offset: int) -> Iterator[tuple[int, bytes]]:
    for table in tables:
        for i, piece in enumerate(round_robin_partition(table, n, offset)):
            yield i, _ipc(piece)


def _joined(blobs: Iterable[tuple[Any, bytes]]) -> Iterator[pa.Table]:
    """A partition's Arrow IPC blobs as one table (none for an empty partition)."""
    tables = [pa.ipc.open_stream(blob).read_all() for _key, blob in blobs]
    if tables:
        yield pa.concat_tables(tables)


def _identity(key: int) -> int:
    return key


def _by_region(splits: Iterator[Split]) -> Iterator[tuple[str, bytes]]:
    """Each split cut into one Arrow IPC blob per region: the rows travel, as in tailguard."""
    for split in splits:
        table = _read(split)
        for region in sorted(set(table["region"].to_pylist())):
            yield region, _ipc(table.filter(pc.equal(table["region"], region)))


def _score_keyed(
    blobs: Iterator[tuple[str, bytes]], work: int
) -> Iterator[tuple[str, tuple[int, int]]]:
    for table in _joined(blobs):
        yield from _sums_rows(example.final_sums(example.partial_sums(example.score(table, work))))


def _region_partition(partitions: int) -> Any:
    # Stable across processes (Python's str hash is salted per interpreter).
    return lambda region: zlib.crc32(region.encode()) % partitions


def _add(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    return a[0] + b[0], a[1] + b[1]


@dataclass(frozen=True)
class PlainRun:
    duration_s: float
    output_rows: int
    tasks: int  # partitions of the CPU stage
    speculative_tasks: int  # speculative copies Spark launched
    stage_work: list[StageWork]
    # Task-seconds of the attempts killed because their twin won (Spark's own record).
    lost_copy_s: float = 0.0
    spark_tasks: list[SparkTask] = field(default_factory=list)


def stage_ids(sc: Any) -> set[int]:
    store = sc._jsc.sc().statusStore()
    stages = store.stageList(None, False, False, sc._gateway.new_array(sc._jvm.double, 0), None)
    return {stages.apply(i).stageId() for i in range(stages.size())}


def spark_tasks(sc: Any, skip: set[int]) -> list[SparkTask]:
    """Spark's own record of the task attempts (its status store, which exists with the UI
    off), leaving out the stages in `skip` (the warm-up's)."""
    store = sc._jsc.sc().statusStore()
    no_quantiles = sc._gateway.new_array(sc._jvm.double, 0)
    stages = store.stageList(None, False, False, no_quantiles, None)
    out: list[SparkTask] = []
    for i in range(stages.size()):
        stage = stages.apply(i)
        if stage.stageId() in skip:
            continue
        listed = store.taskList(stage.stageId(), stage.attemptId(), 1_000_000)
        for j in range(listed.size()):
            task = listed.apply(j)
            duration = task.duration().get() / 1000.0 if task.duration().isDefined() else None
            out.append(
                SparkTask(
                    stage.stageId(),
                    stage.attemptId(),
                    task.index(),
                    str(task.status()),
                    bool(task.speculative()),
                    str(task.host()),
                    duration,
                )
            )
    return out


def settled_tasks(sc: Any, skip: set[int], timeout_s: float = 30.0) -> list[SparkTask]:
    """`spark_tasks` once no attempt is running: a copy that lost is killed after its twin
    has finished, so it may still be running when the job has returned its result."""
    deadline = time.monotonic() + timeout_s
    while True:
        tasks = spark_tasks(sc, skip)
        if all(t.status != "RUNNING" for t in tasks) or time.monotonic() > deadline:
            return tasks
        time.sleep(0.2)  # the status store has no callback reachable from Python


def task_seconds_by_host(sc: Any, skip: set[int], tasks: int) -> dict[str, list[float]]:
    """Spark's own record of where the time went (its status store): per host, the durations of
    the successful tasks of the stages of `tasks` tasks (the job's per-split stage: not the
    reduce), leaving out the stages in `skip`."""
    listed = spark_tasks(sc, skip)
    indices: dict[int, set[int]] = {}
    for task in listed:
        indices.setdefault(task.stage, set()).add(task.index)
    by_host: dict[str, list[float]] = {}
    for task in listed:
        if (
            len(indices[task.stage]) == tasks
            and task.status == "SUCCESS"
            and task.duration_s is not None
        ):
            by_host.setdefault(task.host, []).append(task.duration_s)
    return by_host


# The frame job's map output, as `mapInPandas` declares it.
FRAME_SCHEMA = "region string, revenue long, order_id long"
# A scan task per file (one row group each: runner.prepare_data): an open cost above
# `spark.sql.files.maxPartitionBytes` (128 MiB) keeps Spark from packing the small files into
# one or two tasks, as a team sets it for files that each hold a task's work.
ONE_FILE_PER_TASK = ("spark.sql.files.openCostInBytes", str(256 << 20))


def frame_scan(batches: Iterator[pd.DataFrame], io_s_per_row: float) -> Iterator[pd.DataFrame]:
    """The frame jobs' map step (`mapInPandas`, FRAME_SCHEMA): the I/O job's wait for the rows
    (longer on a slow host), then their revenue, as `score` computes it."""
    for frame in batches:
        table = example.score(example.fetch(pa.Table.from_pandas(frame), io_s_per_row), 0)
        yield table.select(["region", "revenue", "order_id"]).to_pandas()


def run_frame_job(spark: Any, data: Path, output: Path, task_s: float, rows_per_split: int) -> int:
    """The I/O job in the DataFrame API; its scan tasks (one per file)."""
    from pyspark.sql import functions as F

    spark.conf.set(*ONE_FILE_PER_TASK)
    scan = functools.partial(frame_scan, io_s_per_row=task_s / rows_per_split)
    sales = spark.read.parquet(str(data)).mapInPandas(scan, FRAME_SCHEMA)
    totals = sales.groupBy("region").agg(
        F.sum("revenue").alias("revenue"), F.count("order_id").alias("orders")
    )
    totals.write.mode("overwrite").parquet(str(output))
    return len(list(data.glob("*.parquet")))


def warm_frame(spark: Any, data: Path, scratch: Path) -> None:
    """The frame job once without its waits, before the clock, for every contender alike: a
    new application's executors otherwise spend the first scan tasks loading the Parquet
    reader, Arrow and the generated code (measured: 50-60 s for a 12 s scan on 6 cold
    executors over 2 cores). Run inside `tailguard.ignoring`, so that an attached contender's
    services do not take its cold tasks for slow hosts."""
    run_frame_job(spark, data, scratch, 0.0, 1)
    shutil.rmtree(scratch, ignore_errors=True)


def _run_rdd_job(
    sc: Any,
    shape: str,
    data: Path,
    output: Path,
    work: int,
    task_s: float,
    rows_per_split: int,
    stages: int,
) -> int:
    """The RDD forms of the jobs; the tasks of their per-split stage."""
    splits = list_splits(data)
    rdd = sc.parallelize(splits, len(splits))
    if shape == "sales":
        sums = rdd.mapPartitions(lambda it: _score_partials(it, work)).reduceByKey(_add, 1)
    elif shape == "io" and stages > 1:
        n = len(splits)
        tables = rdd.map(_read)
        for _ in range(1, stages):
            # As tailguard's rebalance: each table waited, cut into n even slices, slice i to
            # partition i (offset by the producer's index, as tailguard's producers do), as
            # Arrow IPC (pickled slices of a table cost more than the rows they hold).
            tables = (
                tables.map(lambda t: io_job.waited(t, task_s, rows_per_split))
                .mapPartitionsWithIndex(lambda i, it: _round_robin(it, n, i))
                .partitionBy(n, _identity)
                .mapPartitions(_joined)
            )
        sums = tables.flatMap(
            lambda t: _sums_rows(io_job.partials(t, task_s, rows_per_split))
        ).reduceByKey(_add, 1)
    elif shape == "io":
        sums = rdd.mapPartitions(lambda it: _io_partials(it, task_s, rows_per_split)).reduceByKey(
            _add, 1
        )
    elif shape == "skew":
        sums = (
            rdd.mapPartitions(_by_region)
            .partitionBy(len(splits), _region_partition(len(splits)))
            .mapPartitions(lambda it: _score_keyed(it, work))
        )
    else:
        raise ValueError(f"unknown job shape {shape!r}")
    rows = sums.collect()
    table = pa.table(
        {
            "region": pa.array([r for r, _ in rows], pa.string()),
            "revenue": pa.array([v[0] for _, v in rows], pa.int64()),
            "orders": pa.array([v[1] for _, v in rows], pa.int64()),
        }
    ).sort_by("region")
    output.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, output / "part-00000.parquet")
    return len(splits)


def run_job(
    spark: Any,
    shape: str,
    data: Path,
    output: Path,
    work: int,
    task_s: float = 0.0,
    rows_per_split: int = 1,
    stages: int = 1,
) -> PlainRun:
    """Run the job and write its output; the time covers the job only (the session exists).
    `work` is the CPU work of the sales and skew jobs, `task_s`, `rows_per_split` and `stages`
    the waits of the I/O job (`IoSize`)."""
    sc = spark.sparkContext
    before = stage_ids(sc)  # the warm-up's stages
    started = time.monotonic()
    if shape == "io-frame":
        splits = run_frame_job(spark, data, output, task_s, rows_per_split)
    elif shape == "io-skew":
        from tailguard.bench import skew_join

        splits = skew_join.run_plain(spark, data, output, skew_join.SKEW_SIZE)
    else:
        splits = _run_rdd_job(sc, shape, data, output, work, task_s, rows_per_split, stages)
    duration = time.monotonic() - started
    tasks = settled_tasks(sc, before)
    return PlainRun(
        duration,
        pq.read_table(output).num_rows,
        splits,
        sum(t.speculative for t in tasks),
        spark_stage_work(tasks),
        lost_copy_s(tasks),
        tasks,
    )
