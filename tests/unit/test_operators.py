"""The PySpark-shaped operators: each one through the graph API and the chain's steps, over a
stream of many record batches, against the same computation on the whole table (pandas or
pyarrow) — and the errors a wrong use gets."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tailguard.agent.executor.batches import StreamSchemaError, rebatch
from tailguard.agent.executor.steps import OperatorStep, StepContext, run_chain
from tailguard.agent.graph.api import Dataset, Exchanged, Job, JobDefinitionError
from tailguard.agent.graph.chaining import chain

BATCH_ROWS = 100


def data(rows: int = 1_050, seed: int = 1) -> pa.Table:
    rng = np.random.default_rng(seed)
    amount = rng.integers(-50, 1_000, size=rows).astype(np.float64)
    amount[rng.random(rows) < 0.05] = np.nan  # missing amounts, as nulls below
    return pa.table(
        {
            "id": np.arange(rows, dtype=np.int64),
            "region": rng.choice(["north", "south", "east", "west", "coast"], size=rows),
            "qty": rng.integers(1, 20, size=rows, dtype=np.int64),
            "amount": pa.array(amount, from_pandas=True),
        }
    )


def batches_of(table: pa.Table, rows: int = BATCH_ROWS) -> list[pa.RecordBatch]:
    return table.to_batches(max_chunksize=rows)


def steps_of(build: Any) -> tuple[OperatorStep, ...]:
    """The steps of the operator(s) `build(input)` adds after a source, through the real API
    and chaining (everything after the source is one chain when it reads FORWARD)."""
    job = Job("ops")
    src = job.read_parquet("in", name="src")
    build(src).write_parquet("out", name="sink")
    chained = chain(job)
    return tuple(s for c in chained.vertices.values() for s in c.steps)


def run(
    steps: tuple[OperatorStep, ...], table: pa.Table, tmp: Path, rows: int = BATCH_ROWS
) -> pa.Table:
    context = StepContext(rows, str(tmp), lambda: None)
    out = list(run_chain(steps, [iter(batches_of(table, rows))], context))
    assert all(b.num_rows <= rows for b in out), "a step passed on a batch above the batch size"
    return pa.Table.from_batches(out)


def frame(table: pa.Table) -> pd.DataFrame:
    return table.to_pandas().reset_index(drop=True)


# ------------------------------------------------------------------------- map_batches


def test_map_batches_calls_the_function_once_per_batch(tmp_path: Path) -> None:
    seen: list[int] = []

    def revenue(batch: pa.RecordBatch) -> pa.RecordBatch:
        assert isinstance(batch, pa.RecordBatch)
        seen.append(batch.num_rows)
        return batch.append_column("revenue", pc.multiply(batch["qty"], batch["id"]))

    table = data()
    got = run(steps_of(lambda d: d.map_batches(revenue)), table, tmp_path)
    assert seen == [100] * 10 + [50]
    expected = table.append_column("revenue", pc.multiply(table["qty"], table["id"]))
    assert got.equals(expected)


def test_map_batches_accepts_a_pandas_result_and_a_bigger_one_is_cut(tmp_path: Path) -> None:
    def doubled(batch: pa.RecordBatch) -> pd.DataFrame:
        df = batch.to_pandas()
        return pd.concat([df, df])

    got = run(steps_of(lambda d: d.map_batches(doubled)), data(300), tmp_path)
    assert got.num_rows == 600


def test_an_empty_input_still_gives_its_columns(tmp_path: Path) -> None:
    empty = data().slice(0, 0)
    context = StepContext(BATCH_ROWS, str(tmp_path), lambda: None)
    steps = steps_of(lambda d: d.map_batches(lambda b: b.append_column("x", b["id"])))
    out = list(
        run_chain(steps, [iter([pa.RecordBatch.from_pylist([], schema=empty.schema)])], context)
    )
    assert [b.num_rows for b in out] == [0]
    assert out[0].schema.names == [*empty.schema.names, "x"]


# ------------------------------------------------------------------------- map_in_arrow / pandas


def test_map_in_arrow_gets_an_iterator_and_may_keep_state(tmp_path: Path) -> None:
    def running_total(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        total = 0
        for batch in batches:
            sums = np.cumsum(batch["qty"].to_numpy()) + total
            total = int(sums[-1])
            yield batch.append_column("running", pa.array(sums))

    table = data()
    got = run(steps_of(lambda d: d.map_in_arrow(running_total)), table, tmp_path)
    assert got["running"].to_pylist() == np.cumsum(table["qty"].to_numpy()).tolist()


def test_map_in_pandas_is_pysparks_iterator_of_frames(tmp_path: Path) -> None:
    calls: list[int] = []

    def big_orders(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        calls.append(1)
        for df in frames:
            yield df[df["qty"] > 10].assign(double=df["qty"] * 2)

    table = data()
    got = run(steps_of(lambda d: d.map_in_pandas(big_orders)), table, tmp_path)
    assert calls == [1]  # once per subtask, over all its batches
    whole = frame(table)
    expected = whole[whole["qty"] > 10].assign(double=whole["qty"] * 2).reset_index(drop=True)
    pd.testing.assert_frame_equal(frame(got), expected)


def test_a_declared_schema_casts_and_orders_the_columns(tmp_path: Path) -> None:
    schema = pa.schema([("qty", pa.float64()), ("id", pa.int64())])

    def passthrough(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        yield from frames

    got = run(steps_of(lambda d: d.map_in_pandas(passthrough, schema)), data(250), tmp_path)
    assert got.schema == schema
    assert got.num_rows == 250


def test_a_declared_schema_types_a_subtask_that_yields_nothing(tmp_path: Path) -> None:
    schema = pa.schema([("n", pa.int64())])

    def nothing(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        yield from ()

    got = run(steps_of(lambda d: d.map_in_arrow(nothing, schema)), data(250), tmp_path)
    assert got.num_rows == 0 and got.schema == schema


def test_an_iterator_operator_that_returns_one_frame_is_told_how_to_fix_it(tmp_path: Path) -> None:
    def per_frame(df: Any) -> pd.DataFrame:
        return pd.DataFrame({"n": [1]})

    with pytest.raises(TypeError, match=r"must take an iterator .* use map_batches"):
        run(steps_of(lambda d: d.map_in_pandas(per_frame)), data(50), tmp_path)


def test_an_iterator_operator_that_yields_the_wrong_kind_is_named(tmp_path: Path) -> None:
    def frames(batches: Iterator[pa.RecordBatch]) -> Iterator[Any]:
        for batch in batches:
            yield batch.to_pandas()

    with pytest.raises(
        TypeError, match=r"'frames' \(map_in_arrow\) must yield pyarrow\.RecordBatch"
    ):
        run(steps_of(lambda d: d.map_in_arrow(frames)), data(50), tmp_path)


def test_batches_whose_types_cannot_be_made_one_are_an_error_naming_the_operator(
    tmp_path: Path,
) -> None:
    def flip(batch: pa.RecordBatch) -> pa.Table:
        value = pa.array(["text"] * batch.num_rows) if batch["id"][0].as_py() else batch["qty"]
        return pa.table({"v": value})

    with pytest.raises(StreamSchemaError, match=r"operator 'flip'.*declare it with schema="):
        run(steps_of(lambda d: d.map_batches(flip)), data(300), tmp_path)


# ------------------------------------------------------------------------- filter / select


def test_filter_and_select_with_compute_expressions(tmp_path: Path) -> None:
    steps = steps_of(
        lambda d: d.filter((pc.field("qty") > 5) & (pc.field("region") != "coast")).select(
            "id", ("revenue", pc.field("qty") * pc.field("amount")), {"r": pc.field("region")}
        )
    )
    table = data()
    got = frame(run(steps, table, tmp_path))
    whole = frame(table)
    kept = whole[(whole["qty"] > 5) & (whole["region"] != "coast")]
    expected = pd.DataFrame(
        {"id": kept["id"], "revenue": kept["qty"] * kept["amount"], "r": kept["region"]}
    ).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, expected)


def test_filter_drops_rows_whose_predicate_is_null(tmp_path: Path) -> None:
    table = data()
    got = run(steps_of(lambda d: d.filter(pc.field("amount") > 0)), table, tmp_path)
    assert got.num_rows == pc.sum(pc.fill_null(pc.greater(table["amount"], 0), False)).as_py()


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda d: d.filter("qty > 5"), "filter takes a pyarrow.compute expression"),
        (lambda d: d.filter(lambda row: True), "for a Python predicate use map_batches"),
        (lambda d: d.select(), "select needs at least one column"),
        (lambda d: d.select(("x", 3)), "'x' must be a pyarrow.compute expression"),
        (lambda d: d.select(42), "select takes column names"),
        (lambda d: d.select("a", ("a", pc.field("b"))), "named more than once"),
        (lambda d: d.map_in_pandas(len, schema="id long"), "schema must be a pyarrow.Schema"),
        (lambda d: d.map_batches("fn"), "map_batches: the operator function must be callable"),
    ],
)
def test_bad_operator_arguments_are_refused_when_the_job_is_built(build: Any, message: str) -> None:
    job = Job("bad")
    with pytest.raises(JobDefinitionError, match=message):
        build(job.read_parquet("in", name="src"))


# ------------------------------------------------------------------------- apply_in_*


def grouped_steps(build: Any) -> tuple[OperatorStep, ...]:
    """The steps of the chain after a partition_by("region") exchange."""
    job = Job("groups")
    src = job.read_parquet("in", name="src")
    build(src.partition_by("region")).write_parquet("out", name="sink")
    return chain(job).vertices[chain(job).chain_of("sink")].steps


def test_apply_in_pandas_calls_once_per_key_group_with_all_its_rows(tmp_path: Path) -> None:
    seen: list[tuple[str, int]] = []

    def top(df: pd.DataFrame) -> pd.DataFrame:
        seen.append((df["region"].iloc[0], len(df)))
        assert df["region"].nunique() == 1
        return df.nlargest(3, "qty", keep="first")[["region", "id", "qty"]]

    table = data()
    got = frame(run(grouped_steps(lambda e: e.apply_in_pandas(top)), table, tmp_path))
    got = got.sort_values(["region", "qty", "id"], ascending=[True, False, True])
    whole = frame(table)
    counts = whole.groupby("region").size()
    assert sorted(seen) == sorted(counts.items())
    expected = (
        whole.groupby("region", group_keys=False)[["region", "id", "qty"]]
        .apply(lambda df: df.nlargest(3, "qty", keep="first"))
        .sort_values(["region", "qty", "id"], ascending=[True, False, True])
    )
    pd.testing.assert_frame_equal(got.reset_index(drop=True), expected.reset_index(drop=True))


def test_apply_in_pandas_with_the_key_first_as_pyspark_allows(tmp_path: Path) -> None:
    def count(key: tuple[Any, ...], df: pd.DataFrame) -> pd.DataFrame:
        return pd.DataFrame({"region": [key[0]], "n": [len(df)]})

    got = frame(run(grouped_steps(lambda e: e.apply_in_pandas(count)), data(), tmp_path))
    got = got.sort_values("region").reset_index(drop=True)
    expected = frame(data()).groupby("region").size().reset_index(name="n")
    pd.testing.assert_frame_equal(got, expected)


def test_apply_in_arrow_gets_tables(tmp_path: Path) -> None:
    def total(key: tuple[Any, ...], group: pa.Table) -> pa.Table:
        assert isinstance(group, pa.Table)
        return pa.table({"region": [key[0]], "qty": [pc.sum(group["qty"]).as_py()]})

    got = frame(run(grouped_steps(lambda e: e.apply_in_arrow(total)), data(), tmp_path))
    got = got.sort_values("region").reset_index(drop=True)
    expected = frame(data()).groupby("region")["qty"].sum().reset_index()
    pd.testing.assert_frame_equal(got, expected)


def test_group_operators_need_partition_by_keys() -> None:
    job = Job("bad")
    src = job.read_parquet("in", name="src")
    for edge in (src, src.rebalance(), src.broadcast()):
        exchanged: Any = edge
        with pytest.raises((JobDefinitionError, AttributeError)):
            exchanged.apply_in_pandas(len)
    with pytest.raises(JobDefinitionError, match="after partition_by"):
        src.rebalance().aggregate(n=("*", "count"))
    with pytest.raises(JobDefinitionError, match="takes 3 positional parameters"):
        src.partition_by("k").apply_in_pandas(lambda a, b, c: a)


def test_map_keeps_its_whole_partition_meaning(tmp_path: Path) -> None:
    # Kept on purpose (docs/agent.md says why): one call with every row of the subtask.
    calls: list[int] = []

    def whole(table: pa.Table) -> pa.Table:
        calls.append(table.num_rows)
        return table.sort_by([("qty", "descending"), ("id", "ascending")])

    table = data()
    got = run(steps_of(lambda d: d.map(whole)), table, tmp_path)
    assert calls == [table.num_rows]
    assert got.equals(table.sort_by([("qty", "descending"), ("id", "ascending")]))
    assert Dataset.map is Exchanged.map  # after an exchange too


def test_a_declared_schema_takes_an_empty_result_without_columns(tmp_path: Path) -> None:
    schema = pa.schema([("id", pa.int64())])

    def none_match(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for df in frames:
            big = df[df["qty"] > 100]
            yield big[["id"]] if len(big) else pd.DataFrame()

    got = run(steps_of(lambda d: d.map_in_pandas(none_match, schema)), data(250), tmp_path)
    assert got.num_rows == 0 and got.schema == schema


# ------------------------------------------------------------------------- aggregate


def test_aggregate_matches_pandas_groupby_agg(tmp_path: Path) -> None:
    steps = grouped_steps(
        lambda e: e.aggregate(
            total=("qty", "sum"),
            rows=("*", "count"),
            amounts=("amount", "count"),
            low=("amount", "min"),
            high=("amount", "max"),
            mean_qty=("qty", "mean"),
            mean_amount=("amount", "mean"),
        )
    )
    table = data(5_000)
    got = frame(run(steps, table, tmp_path))
    whole = frame(table)
    expected = (
        whole.groupby("region")
        .agg(
            total=("qty", "sum"),
            rows=("id", "size"),
            amounts=("amount", "count"),
            low=("amount", "min"),
            high=("amount", "max"),
            mean_qty=("qty", "mean"),
            mean_amount=("amount", "mean"),
        )
        .reset_index()
    )
    pd.testing.assert_frame_equal(got, expected, check_exact=False, rtol=1e-12)
    assert got["total"].dtype == np.int64 and got["rows"].dtype == np.int64


def test_aggregate_holds_one_row_per_key_not_its_input(tmp_path: Path) -> None:
    # Many keys and tiny batches: partial states are merged as they pile up.
    table = pa.table({"region": [f"k{i % 37}" for i in range(2_000)], "qty": list(range(2_000))})
    steps = grouped_steps(lambda e: e.aggregate(qty=("qty", "sum")))
    got = frame(run(steps, table, tmp_path, rows=10))
    expected = frame(table).groupby("region")["qty"].sum().reset_index()
    pd.testing.assert_frame_equal(got, expected)


def test_aggregate_of_an_empty_input_is_typed_and_empty(tmp_path: Path) -> None:
    steps = grouped_steps(lambda e: e.aggregate(total=("qty", "sum"), avg=("qty", "mean")))
    empty = pa.RecordBatch.from_pylist([], schema=data().schema)
    context = StepContext(BATCH_ROWS, str(tmp_path), lambda: None)
    (out,) = list(run_chain(steps, [iter([empty])], context))
    assert out.num_rows == 0
    assert out.schema == pa.schema(
        [("region", pa.string()), ("total", pa.int64()), ("avg", pa.float64())]
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "needs at least one aggregation"),
        ({"x": ("qty", "median")}, "unknown function; use one of sum, count, min, max, mean"),
        ({"x": ("*", "sum")}, "column '\\*' works only with count"),
        ({"region": ("qty", "sum")}, "also a key column"),
        ({"x": ("qty",)}, "must be a \\(column, function\\) pair"),
    ],
)
def test_bad_aggregations_are_refused(kwargs: dict[str, Any], message: str) -> None:
    job = Job("bad")
    with pytest.raises(JobDefinitionError, match=message):
        job.read_parquet("in", name="src").partition_by("region").aggregate(**kwargs)


def test_aggregate_names_a_missing_column(tmp_path: Path) -> None:
    steps = grouped_steps(lambda e: e.aggregate(x=("nope", "sum")))
    with pytest.raises(ValueError, match="no column\\(s\\) \\['nope'\\]"):
        run(steps, data(10), tmp_path)


def test_rebatch_joins_small_pieces_and_cuts_big_ones() -> None:
    table = data(1_000)
    pieces = [
        *table.slice(0, 7).to_batches(),
        *table.slice(7, 500).to_batches(),
        *table.slice(507).to_batches(),
    ]
    out = list(rebatch(iter(pieces), 300))
    assert [b.num_rows for b in out] == [300, 300, 300, 100]
    assert pa.Table.from_batches(out).equals(table)


def test_expression_steps_travel_to_the_executors(tmp_path: Path) -> None:
    # A Deploy carries the steps cloudpickled; compute expressions must survive it.
    from pyspark import cloudpickle

    steps = steps_of(
        lambda d: d.filter(pc.field("qty") > 5).select("id", ("twice", pc.field("qty") * 2))
    )
    shipped = pickle.loads(cloudpickle.dumps(steps))
    table = data()
    got = run(shipped, table, tmp_path)
    assert got.num_rows > 0 and got.equals(run(steps, table, tmp_path))
