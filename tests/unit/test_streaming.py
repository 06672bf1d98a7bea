"""Streamed execution inside an attempt (`execute` on real files): a chain over many batches
gives the whole-table result, a cancelled attempt stops within one batch, memory follows the
batch size and not the input (Arrow's own allocation peak, measured with a proxy memory pool),
group assembly spills, sources read by block, and a failure mid-stream leaves nothing behind."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tailguard.agent.executor import sources
from tailguard.agent.executor.attempt import InputPlan, OutputPlan, TaskSpec, execute
from tailguard.agent.executor.control import AttemptControl, current
from tailguard.agent.executor.groups import key_groups
from tailguard.agent.executor.partitions import (
    PartitionWriter,
    partition_dir,
    read_subpartitions,
    subpartition_path,
    write_partition,
)
from tailguard.agent.executor.sinks import STAGING_DIR, SinkDef, stage_sink_batches
from tailguard.agent.executor.sources import SourceDef, discover_splits, split_batches
from tailguard.agent.executor.steps import OperatorStep
from tailguard.agent.executor.storage import Storage
from tailguard.examples import sales_by_region
from tailguard.model.records import Distribution, ErrorKind, InputRange, PartitionRef

WAIT_S = 30.0
# Arrow allocation pools made for measuring are kept: a buffer freed after its pool would crash.
_POOLS: list[Any] = []


def arrow_peak(fn: Callable[[], Any]) -> tuple[Any, int]:
    """`fn()` and the most bytes Arrow held at once while it ran (its allocations go through a
    fresh proxy pool made the default for the call)."""
    base = pa.default_memory_pool()
    pool = pa.proxy_memory_pool(base)
    _POOLS.append(pool)
    pa.set_memory_pool(pool)
    try:
        result = fn()
    finally:
        gc.collect()
        pa.set_memory_pool(base)
    return result, pool.max_memory()


def write_numbers(path: Path, row_groups: int, rows_per_group: int) -> pa.Table:
    n = row_groups * rows_per_group
    rng = np.random.default_rng(5)
    table = pa.table(
        {
            "id": np.arange(n, dtype=np.int64),
            "k": rng.integers(0, 50, size=n, dtype=np.int64),
            "a": rng.integers(0, 1_000, size=n, dtype=np.int64),
            "b": rng.integers(0, 1_000, size=n, dtype=np.int64),
        }
    )
    pq.write_table(table, path, row_group_size=rows_per_group)
    return table


def task(
    tmp: Path,
    data: Path,
    steps: tuple[OperatorStep, ...],
    *,
    batch_rows: int,
    attempt: int = 0,
    subpartitions: int = 1,
    keys: tuple[str, ...] = (),
    sink: bool = False,
    fail_with: str | None = None,
) -> TaskSpec:
    source = SourceDef("parquet", (str(data),))
    splits = tuple(discover_splits(source))
    distribution = Distribution.ALL_TO_ALL if keys else Distribution.FORWARD
    return TaskSpec(
        job_id="job",
        storage=Storage(str(tmp / "storage")),
        vertex="chain",
        subtask=0,
        attempt=attempt,
        steps=steps,
        source=source,
        splits=splits,
        output=None if sink else OutputPlan(distribution, keys, subpartitions),
        sink=SinkDef("parquet", str(tmp / "out")) if sink else None,
        input_bytes=sum(s.bytes for s in splits),
        batch_rows=batch_rows,
        fail_with=fail_with,
    )


def output_of(spec: TaskSpec, checksums: tuple[str, ...]) -> pa.Table:
    table, _ = read_subpartitions(
        spec.storage,
        spec.job_id,
        spec.vertex,
        {spec.subtask: spec.attempt},
        (spec.subtask, spec.subtask),
        (0, len(checksums) - 1),
        {(spec.subtask, sp): c for sp, c in enumerate(checksums)},
    )
    return table


def add_sum(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch.append_column("s", pc.add(batch["a"], batch["b"]))


def keep_even(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        yield batch.filter(pc.equal(pc.bit_wise_and(batch["id"], 1), 0))


STREAMED = (
    OperatorStep("add_sum", add_sum, "map_batches"),
    OperatorStep("keep_even", keep_even, "map_in_arrow"),
    OperatorStep("big", None, "filter", predicate=pc.field("s") > 500),
)


def whole_table(table: pa.Table) -> pa.Table:
    table = table.append_column("s", pc.add(table["a"], table["b"]))
    table = table.filter(pc.equal(pc.bit_wise_and(table["id"], 1), 0))
    return table.filter(pc.greater(table["s"], 500))


# ----------------------------------------------------------------------------- the chain


def test_a_chain_over_many_batches_equals_the_whole_table_result(tmp_path: Path) -> None:
    data = tmp_path / "in.parquet"
    table = write_numbers(data, row_groups=7, rows_per_group=1_000)
    spec = task(tmp_path, data, STREAMED, batch_rows=128, subpartitions=4, keys=("k",))
    outcome = execute(spec)
    assert outcome.ok, outcome.message
    got = output_of(spec, outcome.checksums).sort_by("id")
    assert got.equals(whole_table(table))
    assert outcome.records == got.num_rows
    assert outcome.input_bytes == spec.input_bytes


def test_checksums_depend_on_the_rows_not_on_how_they_were_batched(tmp_path: Path) -> None:
    # The same rows in files of other row groups reach the writer in other batches: the
    # partition's bytes (and so failover's "unless-checksum-matches") must not change.
    outcomes = []
    for index, rows_per_group in enumerate((1_000, 350, 7_000)):
        data = tmp_path / f"in{index}.parquet"
        write_numbers(data, row_groups=7_000 // rows_per_group, rows_per_group=rows_per_group)
        spec = task(
            tmp_path, data, STREAMED, batch_rows=256, attempt=index, subpartitions=5, keys=("k",)
        )
        outcome = execute(spec)
        assert outcome.ok, outcome.message
        outcomes.append(outcome)
    assert len({o.checksums for o in outcomes}) == 1
    assert len(set(outcomes[0].checksums)) == 5


def test_the_partition_writer_cuts_file_batches_at_fixed_rows(tmp_path: Path) -> None:
    storage = Storage(str(tmp_path))
    table = pa.table({"x": np.arange(10_000), "s": [str(i) for i in range(10_000)]})
    sums = []
    for attempt, pieces in enumerate((1, 3, 17)):
        writer = PartitionWriter(storage, "job", PartitionRef("v", 0, attempt), 2, 1_000)
        for chunk in np.array_split(np.arange(table.num_rows), pieces):
            part = pa.Table.from_batches(
                [table.take(pa.array(chunk)).combine_chunks().to_batches()[0]]
            )
            odd = pc.equal(pc.bit_wise_and(part["x"], 1), 1)
            evens, odds = part.filter(pc.invert(odd)), part.filter(odd)
            writer.add(
                [evens.combine_chunks().to_batches()[0], odds.combine_chunks().to_batches()[0]]
            )
        sums.append(writer.finish().checksums)
    assert sums[0] == sums[1] == sums[2]


# ----------------------------------------------------------------------------- cancellation


class Gate:
    """An operator that stops at batch `at` until the test has cancelled the attempt."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.seen: list[int] = []
        self.progress: list[int] = []
        self.reached = threading.Event()
        self.release = threading.Event()

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        self.seen.append(batch.num_rows)
        control = current()
        assert control is not None
        self.progress.append(control.records_read)
        if len(self.seen) == self.at:
            self.reached.set()
            assert self.release.wait(WAIT_S)
        return batch


@pytest.mark.parametrize("sink", [False, True])
def test_a_cancelled_attempt_stops_within_one_batch(tmp_path: Path, sink: bool) -> None:
    data = tmp_path / "in.parquet"
    write_numbers(data, row_groups=4, rows_per_group=2_500)
    gate = Gate(at=3)
    steps = (
        OperatorStep("gate", gate, "map_batches"),
        OperatorStep("after", add_sum, "map_batches"),
    )
    spec = task(tmp_path, data, steps, batch_rows=500, sink=sink)
    control = AttemptControl(spec.input_bytes)
    outcomes: list[Any] = []
    runner = threading.Thread(target=lambda: outcomes.append(execute(spec, control)))
    runner.start()
    assert gate.reached.wait(WAIT_S)
    control.cancel()
    gate.release.set()
    runner.join(WAIT_S)
    (outcome,) = outcomes
    assert outcome.cancelled and not outcome.ok
    # The batch being processed when the cancel came was the last one: none after it.
    assert gate.seen == [500, 500, 500]
    # Progress is counted per batch, and the reader was at most one batch ahead.
    assert gate.progress == sorted(gate.progress) and gate.progress[0] >= 500
    assert control.records_read <= 4 * 500
    # Nothing half-written is left: no partition files, no staged sink file.
    leftovers = [p for p in (tmp_path / "storage").rglob("*") if p.is_file()]
    assert leftovers == [], leftovers


# ----------------------------------------------------------------------------- memory


def test_memory_follows_the_batch_size_not_the_input(tmp_path: Path) -> None:
    data = tmp_path / "in.parquet"
    table = write_numbers(data, row_groups=40, rows_per_group=10_000)  # 400k rows, 12.8 MB
    input_bytes = table.nbytes
    streamed = task(tmp_path, data, STREAMED, batch_rows=5_000, sink=True)
    whole_steps = (OperatorStep("whole", whole_table, "arrow"),)
    whole = task(tmp_path, data, whole_steps, batch_rows=5_000, attempt=1, sink=True)
    streamed_outcome, streamed_peak = arrow_peak(lambda: execute(streamed))
    whole_outcome, whole_peak = arrow_peak(lambda: execute(whole))
    assert streamed_outcome.ok and whole_outcome.ok
    assert streamed_outcome.staged.checksum == whole_outcome.staged.checksum  # same file
    batch_bytes = 5_000 * (4 + 1) * 8  # a batch with the added column
    # The chain is 3 operators deep; what is held is a few batches, whatever the input size.
    assert streamed_peak < 3 * 4 * batch_bytes, (streamed_peak, batch_bytes)
    assert whole_peak > input_bytes > 10 * streamed_peak, (whole_peak, streamed_peak)


def test_group_assembly_spills_and_holds_a_bounded_number_of_rows(tmp_path: Path) -> None:
    rows, batch_rows = 80_000, 1_000
    rng = np.random.default_rng(3)
    table = pa.table({"k": rng.integers(0, 200, size=rows), "v": rng.integers(0, 100, size=rows)})
    spill = tmp_path / "spill"
    spill.mkdir()
    spilled: list[int] = []

    def groups() -> dict[int, tuple[int, int]]:
        found: dict[int, tuple[int, int]] = {}

        for key, group in key_groups(
            iter(table.to_batches(batch_rows)), ["k"], batch_rows, str(spill), lambda: None
        ):
            if not found:  # the buckets are written before the first group comes out
                spilled.append(sum(1 for _ in spill.rglob("*.arrow")))
            assert key not in found, "a key came in two groups"
            found[key[0]] = (group.num_rows, pc.sum(group["v"]).as_py())
        return found

    found, peak = arrow_peak(groups)
    expected = table.to_pandas().groupby("k")["v"].agg(["size", "sum"])
    assert found == {k: (int(r["size"]), int(r["sum"])) for k, r in expected.iterrows()}
    assert max(spilled) > 0, "the input was larger than the budget but nothing was spilled"
    assert not any(spill.iterdir()), "spill files left behind"
    batch_bytes = batch_rows * 16
    assert peak < 12 * batch_bytes < table.nbytes / 4, (peak, batch_bytes, table.nbytes)


# ----------------------------------------------------------------------------- sources


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_text_sources_stream_by_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str
) -> None:
    monkeypatch.setattr(sources, "TEXT_BLOCK_BYTES", 4_096)
    frame = pd.DataFrame({"id": range(3_000), "name": [f"n{i}" for i in range(3_000)]})
    path = tmp_path / f"in.{fmt}"
    if fmt == "csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_json(path, orient="records", lines=True)
    source = SourceDef(fmt, (str(path),))  # type: ignore[arg-type]
    (split,) = discover_splits(source)
    batches = list(split_batches(source, split, 200))
    assert len(batches) > 10 and all(b.num_rows <= 200 for b, _ in batches)
    assert sum(n for _, n in batches) == split.bytes == path.stat().st_size
    got = pa.Table.from_batches([b for b, _ in batches if b.num_rows]).to_pandas()
    pd.testing.assert_frame_equal(got, frame)


def test_parquet_splits_stream_by_batch_and_account_for_their_bytes(tmp_path: Path) -> None:
    data = tmp_path / "in.parquet"
    table = write_numbers(data, row_groups=3, rows_per_group=1_000)
    source = SourceDef("parquet", (str(data),))
    read: list[pa.RecordBatch] = []
    for split in discover_splits(source):
        pieces = list(split_batches(source, split, 300))
        assert [b.num_rows for b, _ in pieces] == [300, 300, 300, 100]
        assert sum(n for _, n in pieces) == split.bytes
        read.extend(b for b, _ in pieces)
    assert pa.Table.from_batches(read).equals(table)


# ----------------------------------------------------------------------------- failures


@pytest.mark.parametrize("sink", [False, True])
def test_a_failure_mid_stream_leaves_nothing_behind(tmp_path: Path, sink: bool) -> None:
    data = tmp_path / "in.parquet"
    write_numbers(data, row_groups=4, rows_per_group=1_000)
    seen: list[int] = []

    def counted(batch: pa.RecordBatch) -> pa.RecordBatch:
        seen.append(batch.num_rows)
        return batch

    steps = (OperatorStep("counted", counted, "map_batches"),)
    spec = task(tmp_path, data, steps, batch_rows=100, sink=sink, fail_with="injected mid-stream")
    outcome = execute(spec)
    assert not outcome.ok and "injected mid-stream" in outcome.message
    assert 1 <= len(seen) < 40, "the failure did not come mid-stream"
    root = tmp_path / "storage" / "job"
    written = (
        root / STAGING_DIR
        if sink
        else Path(partition_dir(spec.storage, "job", PartitionRef("chain", 0, 0)))
    )
    assert not written.exists() or not [p for p in written.rglob("*") if p.is_file()]


def test_the_sales_example_operators_stream_to_the_whole_table_result(tmp_path: Path) -> None:
    data = sales_by_region.generate(tmp_path / "sales", files=2, rows_per_file=3_000)
    job = sales_by_region.make_job(data, tmp_path / "out")
    from tailguard.agent.graph.chaining import chain

    head = chain(job).vertices["sales→score→partial"]
    spec = task(tmp_path, data, head.steps, batch_rows=250, subpartitions=3, keys=("region",))
    outcome = execute(spec)
    assert outcome.ok, outcome.message
    got = output_of(spec, outcome.checksums).to_pandas()
    got = got.groupby("region")[["revenue", "orders"]].sum().reset_index()
    expected = sales_by_region.reference(data)
    pd.testing.assert_frame_equal(got, expected[got.columns.tolist()])


# ------------------------------------------------------------------ one-pass verification


def corrupt_consumer(
    tmp: Path, steps: tuple[OperatorStep, ...], *, sink: bool = False
) -> tuple[TaskSpec, Path]:
    """A consumer attempt reading one producer partition (many batches) whose file has one byte
    changed near its end, so its first batches decode before the mismatch can be found."""
    storage = Storage(str(tmp / "storage"))
    rng = np.random.default_rng(11)
    n = 200_000
    produced = pa.table({"id": np.arange(n), "x": rng.random(n)})
    ref = PartitionRef("producer", 0, 0)
    written = write_partition(storage, "job", ref, [produced])
    path = Path(subpartition_path(storage, "job", ref, 0))
    data = bytearray(path.read_bytes())
    data[-200] ^= 0xFF
    path.write_bytes(bytes(data))
    plan = InputPlan(
        (InputRange("producer", 0, 0, 0, 0),),
        Distribution.FORWARD,
        {0: 0},
        {(0, 0): written.checksums[0]},
    )
    spec = TaskSpec(
        job_id="job",
        storage=storage,
        vertex="consumer",
        subtask=0,
        attempt=0,
        steps=steps,
        inputs=(plan,),
        output=None if sink else OutputPlan(Distribution.FORWARD, (), 1),
        sink=SinkDef("parquet", str(tmp / "out")) if sink else None,
        batch_rows=1_000,
    )
    return spec, path


@pytest.mark.parametrize("sink", [False, True])
def test_a_corrupt_partition_is_found_in_the_reading_pass_and_nothing_is_committed(
    tmp_path: Path, sink: bool
) -> None:
    seen: list[int] = []

    def record(batch: pa.RecordBatch) -> pa.RecordBatch:
        seen.append(batch.num_rows)
        return batch

    spec, path = corrupt_consumer(
        tmp_path, (OperatorStep("record", record, "map_batches"),), sink=sink
    )
    outcome = execute(spec)
    assert not outcome.ok
    assert outcome.error is ErrorKind.PARTITION_CORRUPT, outcome.message
    assert outcome.missing_partition == PartitionRef("producer", 0, 0)
    assert str(path) in outcome.message
    # One pass: rows reached the operator before the mismatch was found, and still nothing
    # of this attempt's output exists (no completion marker, no files, no staged sink part).
    assert seen
    written = (
        tmp_path / "storage" / "job" / STAGING_DIR
        if sink
        else Path(partition_dir(spec.storage, "job", PartitionRef("consumer", 0, 0)))
    )
    assert not written.exists() or not [p for p in written.rglob("*") if p.is_file()]


def test_an_operator_that_stops_reading_early_still_gets_its_input_verified(
    tmp_path: Path,
) -> None:
    def first_only(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield next(batches)

    spec, _ = corrupt_consumer(tmp_path, (OperatorStep("first", first_only, "map_in_arrow"),))
    outcome = execute(spec)
    assert outcome.error is ErrorKind.PARTITION_CORRUPT, outcome.message


def test_a_user_error_on_a_corrupt_partition_is_reported_as_the_corruption(
    tmp_path: Path,
) -> None:
    calls: list[int] = []

    def choke(batch: pa.RecordBatch) -> pa.RecordBatch:
        calls.append(1)
        if len(calls) == 3:
            raise ZeroDivisionError("choked on a value")
        return batch

    spec, _ = corrupt_consumer(tmp_path, (OperatorStep("choke", choke, "map_batches"),))
    outcome = execute(spec)
    assert outcome.error is ErrorKind.PARTITION_CORRUPT, outcome.message
    assert len(calls) == 3


def test_a_user_error_on_a_sound_partition_stays_the_users(tmp_path: Path) -> None:
    def choke(batch: pa.RecordBatch) -> pa.RecordBatch:
        raise ZeroDivisionError("choked on a value")

    spec, _ = corrupt_consumer(tmp_path, (OperatorStep("choke", choke, "map_batches"),))
    written = write_partition(
        spec.storage, "job", PartitionRef("producer", 0, 1), [pa.table({"id": [1, 2]})]
    )
    plan = InputPlan(
        (InputRange("producer", 0, 0, 0, 0),),
        Distribution.FORWARD,
        {0: 1},
        {(0, 0): written.checksums[0]},
    )
    outcome = execute(replace(spec, inputs=(plan,)))
    assert outcome.error is ErrorKind.USER
    assert "choked on a value" in outcome.message


def test_the_writer_holds_bounded_memory_when_one_subpartition_gets_few_rows(
    tmp_path: Path,
) -> None:
    """Pieces are held as slices of their batch: a subpartition that gets one row per batch
    would keep every batch alive until it has a file batch's worth; the writer copies such
    rows out instead."""
    storage = Storage(str(tmp_path))
    batches, rows = 300, 1_000
    rng = np.random.default_rng(3)
    source = [
        pa.record_batch({"a": rng.integers(0, 1 << 40, rows), "b": rng.random(rows)})
        for _ in range(batches)
    ]
    input_bytes = sum(b.nbytes for b in source)

    def write() -> None:
        writer = PartitionWriter(storage, "job", PartitionRef("v", 0, 0), 4, rows)
        for batch in source:
            writer.add(
                [
                    batch.slice(0, 333),
                    batch.slice(333, 333),
                    batch.slice(666, 333),
                    batch.slice(999, 1),
                ]
            )
        writer.finish()

    _, peak = arrow_peak(write)
    # The rows waiting (under 4 x 1,000) plus as many again plus one batch: about 140 KiB of
    # these rows, against 4.6 MiB of input; Arrow's IPC and compression buffers come on top.
    assert peak < input_bytes / 4, (peak, input_bytes)


def test_the_sink_keeps_dictionaries_for_low_cardinality_columns_only(tmp_path: Path) -> None:
    """Dictionary pages fall back to plain past 64 KiB (the writer holds a dictionary-encoded
    column's pages in memory until then); a column of few values keeps its dictionary."""
    n = 60_000
    rng = np.random.default_rng(2)
    table = pa.table(
        {"unique": rng.integers(0, 1 << 62, n), "few": [f"c{i % 9}" for i in range(n)]}
    )
    storage = Storage(str(tmp_path))
    staged, rows = stage_sink_batches(storage, "job", "sink", 0, 0, iter(table.to_batches()), n)
    assert rows == n
    column = pq.ParquetFile(staged.path).metadata.row_group(0).column
    unique, few = column(0), column(1)

    def dictionary_page_bytes(chunk: Any) -> int:
        return int(chunk.data_page_offset - chunk.dictionary_page_offset)

    # The few values: a dictionary, then pages of small indices (under a byte a row).
    assert few.has_dictionary_page and few.total_uncompressed_size < n
    # 60,000 random int64s would make a 469 KiB dictionary at Parquet's 1 MiB default limit.
    assert dictionary_page_bytes(unique) <= (64 << 10) + 1024
    assert pq.read_table(staged.path).equals(table)
