"""The relational join, `a.join(b, on=..., how=...)`: the core (`executor/joins.py`, a pure
function of two record-batch streams and a memory bound) against pandas `merge` with Spark's
null rules, in memory and spilled; the graph API's checks; and the step in a chain."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.examples_budget import examples
from tests.join_reference import spark_join

from tailguard.agent.executor.joins import JoinSpec, default_build, hash_join
from tailguard.agent.executor.spill import SpillStats
from tailguard.agent.executor.steps import StepContext, run_chain
from tailguard.agent.graph.api import Job, JobDefinitionError
from tailguard.agent.graph.chaining import chain
from tailguard.model.records import Distribution
from tailguard.testing.tables import as_table, compare_tables

HOWS = ("inner", "left", "right", "full", "semi", "anti")


def joined(
    left: pa.Table,
    right: pa.Table,
    on: tuple[str, ...],
    how: str,
    memory: int,
    *,
    batch: int = 7,
    build: str | None = None,
    stats: SpillStats | None = None,
    batch_rows: int = 50,
) -> pa.Table:
    spec = JoinSpec(on, how, build or default_build(how), memory)  # type: ignore[arg-type]
    with tempfile.TemporaryDirectory() as spill:
        out = list(
            hash_join(
                _batches(left, batch),
                _batches(right, batch),
                spec,
                batch_rows,
                spill,
                lambda: None,
                stats,
            )
        )
        assert not os.listdir(spill), "spill files left behind"
    assert all(b.num_rows <= batch_rows for b in out)
    return pa.Table.from_batches(out) if out else pa.table({})


def _batches(table: pa.Table, rows: int) -> Iterator[pa.RecordBatch]:
    """The stream of a table as an attempt's input gives it: at least one batch (the schema)."""
    batches = table.to_batches(max_chunksize=rows)
    yield from batches or [pa.RecordBatch.from_pylist([], schema=table.schema)]


def assert_matches_reference(
    out: pa.Table, left: pa.Table, right: pa.Table, on: Any, how: str
) -> None:
    reference = spark_join(left.to_pandas(), right.to_pandas(), list(on), how)
    assert out.column_names == list(reference.columns), (out.column_names, list(reference.columns))
    diff = compare_tables(
        out, as_table(reference, "reference"), ignore_order=True, check_types=False
    )
    assert diff.equal, diff.message(f"{how} join differs from pandas merge:")


# ---------------------------------------------------------------------------- properties

_key = st.one_of(st.none(), st.integers(0, 6))


@st.composite
def sides(draw: Any, two_keys: bool) -> tuple[pa.Table, pa.Table]:
    def table(payload: str) -> pa.Table:
        n = draw(st.integers(0, 40))
        columns: dict[str, Any] = {
            "k": pa.array(draw(st.lists(_key, min_size=n, max_size=n)), pa.int64())
        }
        if two_keys:
            columns["j"] = pa.array(
                draw(st.lists(st.sampled_from(["a", "b", None]), min_size=n, max_size=n)),
                pa.string(),
            )
        columns[payload] = pa.array(np.arange(n, dtype=np.int64))
        return pa.table(columns)

    return table("a"), table("b")


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    two_keys=st.booleans(),
    how=st.sampled_from(HOWS),
    memory=st.sampled_from([1, 300, 2_000, 10**9]),
    batch=st.integers(1, 12),
)
def test_every_join_type_is_pandas_merge_with_sparks_nulls(
    data: Any, two_keys: bool, how: str, memory: int, batch: int
) -> None:
    left, right = data.draw(sides(two_keys))
    on = ("k", "j") if two_keys else ("k",)
    stats = SpillStats()
    out = joined(left, right, on, how, memory, batch=batch, stats=stats)
    assert_matches_reference(out, left, right, on, how)
    build = right if default_build(how) == "right" else left  # type: ignore[arg-type]
    if memory == 10**9:
        assert stats.bytes == 0, "a build side within its bound was spilled"
    elif memory == 1 and _kept_build_rows(build, on, how):
        assert stats.bytes > 0, "a build side above its bound was not spilled"


def _kept_build_rows(build: pa.Table, on: tuple[str, ...], how: str) -> int:
    """Rows of the build side the join reads (null keys are dropped where nothing keeps them)."""
    if how == "full":
        return build.num_rows
    frame = build.to_pandas()
    return int((~frame[list(on)].isna().any(axis=1)).sum())


@settings(max_examples=examples(30), deadline=None)
@given(data=st.data(), how=st.sampled_from(HOWS), memory=st.sampled_from([1, 10**9]))
def test_the_output_does_not_depend_on_how_the_input_was_batched(
    data: Any, how: str, memory: int
) -> None:
    left, right = data.draw(sides(False))
    first = joined(left, right, ("k",), how, memory, batch=1)
    again = joined(left, right, ("k",), how, memory, batch=data.draw(st.integers(2, 50)))
    assert first.equals(again), "the same rows in other batches gave other output"


@settings(max_examples=examples(30), deadline=None)
@given(data=st.data(), how=st.sampled_from(["inner", "left", "right"]))
def test_either_side_may_be_the_build_side_where_the_type_allows(data: Any, how: str) -> None:
    left, right = data.draw(sides(False))
    for build in {"inner": ("left", "right"), "left": ("right",), "right": ("left",)}[how]:
        out = joined(left, right, ("k",), how, 200, build=build)
        assert_matches_reference(out, left, right, ("k",), how)


# ---------------------------------------------------------------------------- spilling


def test_a_build_side_above_its_bound_spills_and_splits_a_large_bucket_again() -> None:
    rng = np.random.default_rng(5)
    n = 20_000
    keys = rng.integers(0, 5_000, n)
    left = pa.table({"k": keys[: n // 2], "a": np.arange(n // 2)})
    right = pa.table({"k": keys, "b": rng.random(n)})
    stats = SpillStats()
    # ~320 KB of build side against 4 KB: 32 buckets of ~10 KB each are split once more.
    out = joined(left, right, ("k",), "full", 4_000, batch=1_000, stats=stats, batch_rows=1_000)
    assert_matches_reference(out, left, right, ("k",), "full")
    assert stats.files > 2 * 32, stats
    assert stats.rows >= n, stats


def test_null_keys_never_match_and_spread_when_spilled() -> None:
    # Every build row has a null key: kept by a full join, they must not pile into one bucket.
    left = pa.table({"k": pa.array([None, 1, None], pa.int64()), "a": [1, 2, 3]})
    right = pa.table({"k": pa.array([None] * 2_000, pa.int64()), "b": np.arange(2_000)})
    stats = SpillStats()
    out = joined(left, right, ("k",), "full", 1_000, batch=100, stats=stats)
    assert_matches_reference(out, left, right, ("k",), "full")
    assert out.num_rows == 2_003
    assert stats.files >= 32, "null keys were not spread over the buckets"


def test_a_hot_key_above_the_bound_is_taken_whole_after_the_last_split() -> None:
    left = pa.table({"k": [7, 8], "a": [1, 2]})
    right = pa.table({"k": [7] * 5_000 + [8], "b": np.arange(5_001)})
    out = joined(left, right, ("k",), "inner", 2_000, batch=500)
    assert out.num_rows == 5_001
    assert_matches_reference(out, left, right, ("k",), "inner")


def test_memory_stays_near_the_bound_when_the_build_side_is_far_larger(tmp_path: Path) -> None:
    """Arrow's peak allocation over a join whose build side is ~6x its bound (in a fresh
    process, so the pool's peak is this join's)."""
    script = textwrap.dedent(
        """
        import sys, tempfile
        import numpy as np, pyarrow as pa
        from tailguard.agent.executor.joins import JoinSpec, hash_join
        from tailguard.agent.executor.spill import SpillStats
        bound, rows = 8 * 2**20, 10_000
        def side(seed, n, name):
            rng = np.random.default_rng(seed)
            for start in range(0, n, rows):
                yield pa.record_batch({"k": rng.integers(0, n, rows), name: rng.random(rows),
                                       name + "2": rng.random(rows)})
        stats = SpillStats()
        pool = pa.default_memory_pool()
        base = pool.bytes_allocated()
        out = 0
        with tempfile.TemporaryDirectory() as spill:
            for batch in hash_join(side(1, 200_000, "a"), side(2, 2_000_000, "b"),
                                   JoinSpec(("k",), "left", "right", bound), rows, spill,
                                   lambda: None, stats):
                out += batch.num_rows
        build = 2_000_000 * 24
        print(out, stats.bytes, build, pool.max_memory() - base)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=300
    )
    rows, spilled, build_bytes, peak = map(int, done.stdout.split())
    bound = 8 * 2**20
    assert rows >= 200_000
    assert spilled >= build_bytes, "the build side was not spilled"
    assert peak < 2 * bound, (
        f"Arrow's peak {peak / 2**20:.1f} MiB for a {bound / 2**20:.0f} MiB bound"
    )


# ---------------------------------------------------------------------------- types


def test_keys_of_different_widths_and_encodings_match() -> None:
    left = pa.table(
        {
            "k": pa.array([1, 2, None], pa.int32()),
            "s": pa.array(["x", "y", "x"]).dictionary_encode(),
        }
    )
    right = pa.table(
        {
            "k": pa.array([2, 1], pa.int64()),
            "s": pa.array(["y", "x"], pa.large_string()),
            "b": [20, 10],
        }
    )
    out = joined(left, right, ("k", "s"), "left", 10**9)
    assert out.schema.field("k").type == pa.int64()
    assert sorted(out.to_pylist(), key=repr) == sorted(
        [
            {"k": 1, "s": "x", "b": 10},
            {"k": 2, "s": "y", "b": 20},
            {"k": None, "s": "x", "b": None},
        ],
        key=repr,
    )


def test_float_keys_compare_as_spark_normalises_them() -> None:
    left = pa.table({"k": [0.0, float("nan"), 1.5], "a": [1, 2, 3]})
    right = pa.table({"k": [-0.0, float("nan"), 2.5], "b": [10, 20, 30]})
    out = joined(left, right, ("k",), "inner", 10**9)
    assert sorted(out.column("a").to_pylist()) == [1, 2]


def test_nested_and_null_typed_columns_travel_on_both_sides() -> None:
    left = pa.table({"k": [1, 2, 3], "l": pa.array([[1], [2, 2], []]), "n": pa.nulls(3)})
    right = pa.table({"k": [2, 3, 4], "s": pa.array([{"x": 1}, {"x": 2}, {"x": 3}])})
    for memory in (10**9, 1):
        out = joined(left, right, ("k",), "full", memory)
        rows = sorted(out.to_pylist(), key=lambda r: r["k"])
        assert rows == [
            {"k": 1, "l": [1], "n": None, "s": None},
            {"k": 2, "l": [2, 2], "n": None, "s": {"x": 1}},
            {"k": 3, "l": [], "n": None, "s": {"x": 2}},
            {"k": 4, "l": None, "n": None, "s": {"x": 3}},
        ]


@pytest.mark.parametrize(
    ("left", "right", "message"),
    [
        ({"k": [1], "v": [1]}, {"k": [1], "v": [2]}, "['v'] are on both sides"),
        ({"k": [1]}, {"key": [1]}, "the right side has no column(s) ['k']"),
        ({"k": [1]}, {"k": [1.0]}, "join key 'k' is int64 on the left and double on the right"),
    ],
)
def test_columns_that_cannot_be_joined_are_named(
    left: dict[str, Any], right: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match="join") as err:
        joined(pa.table(left), pa.table(right), ("k",), "inner", 10**9)
    assert message in str(err.value)


def test_semi_and_anti_keep_only_the_left_columns_and_left_rows_once() -> None:
    left = pa.table({"k": [1, 1, 2, None], "a": [1, 2, 3, 4]})
    right = pa.table({"k": [1, 1, 1], "v": [0, 0, 0]})  # a shared column is fine: not output
    semi = joined(left, right, ("k",), "semi", 10**9)
    anti = joined(left, right, ("k",), "anti", 10**9)
    assert semi.to_pydict() == {"k": [1, 1], "a": [1, 2]}
    assert anti.to_pydict() == {"k": [2, None], "a": [3, 4]}


# ---------------------------------------------------------------------------- the graph API


def _two_sources() -> tuple[Job, Any, Any]:
    job = Job("joins")
    return job, job.read_parquet("l", name="l"), job.read_parquet("r", name="r")


def test_a_plain_join_partitions_both_sides_by_the_keys() -> None:
    job, left, right = _two_sources()
    out = left.join(right, on=["k", "j"], how="left_outer", name="j1", memory="1 MiB")
    out.write_parquet("out", name="sink")
    vertex = job.vertices["j1"]
    assert [(i.producer, i.distribution, i.keys) for i in vertex.inputs] == [
        ("l", Distribution.ALL_TO_ALL, ("k", "j")),
        ("r", Distribution.ALL_TO_ALL, ("k", "j")),
    ]
    assert vertex.step is not None and vertex.step.join == JoinSpec(
        ("k", "j"), "left", "right", 2**20
    )
    # A join heads its chain; its consumer chains to it.
    assert chain(job).chain_of("sink") == "j1→sink"


def test_a_broadcast_side_is_the_build_side_and_the_other_is_not_shuffled() -> None:
    job, left, right = _two_sources()
    left.broadcast().join(right, "k", "right", name="j1").write_parquet("out")
    vertex = job.vertices["j1"]
    assert [i.distribution for i in vertex.inputs] == [Distribution.BROADCAST, Distribution.FORWARD]
    assert vertex.step is not None and vertex.step.join is not None
    assert vertex.step.join.build == "left"


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda x, y: x.join(y.broadcast(), "k", "full"), "for a full join broadcast neither side"),
        (lambda x, y: x.broadcast().join(y, "k", "left"), "its left side cannot be broadcast"),
        (lambda x, y: x.join(y.broadcast(), "k", "right"), "for a right join broadcast left"),
        (lambda x, y: x.broadcast().join(y, "k", "anti"), "for a anti join broadcast right"),
        (lambda x, y: x.broadcast().join(y.broadcast(), "k"), "broadcast one side at most"),
        (lambda x, y: x.partition_by("x").join(y, "k"), "read through partition_by('x')"),
        (lambda x, y: x.join(y.rebalance(), "k"), "the right side is read through rebalance()"),
        (lambda x, y: x.join(y, "k", "cross"), "how='cross'"),
        (lambda x, y: x.join(y), "on= names the key column(s)"),
        (lambda x, y: x.join(y, ["k", "k"]), "names a column twice"),
        (lambda x, y: x.join(y, "k", memory="lots"), "memory='lots'"),
        (lambda x, y: x.join(y, "k", memory=0), "positive number of bytes"),
        (lambda x, y: x.join(y, lambda a, b: a, "inner"), "either a function or on="),
        (lambda x, y: x.join(y, "k", pandas=True), "pandas=True applies to join(other, fn)"),
    ],
)
def test_joins_that_cannot_run_are_refused_when_built(build: Any, message: str) -> None:
    _, left, right = _two_sources()
    with pytest.raises(JobDefinitionError) as err:
        build(left, right)
    assert message in str(err.value)


def test_pysparks_spellings_of_how_are_accepted() -> None:
    for spelling, how in [
        ("outer", "full"),
        ("fullouter", "full"),
        ("leftsemi", "semi"),
        ("left_anti", "anti"),
        ("RIGHT_OUTER", "right"),
        (None, "inner"),
    ]:
        job, left, right = _two_sources()
        left.join(right, "k", spelling, name="j").write_parquet("o")
        step = job.vertices["j"].step
        assert step is not None and step.join is not None and step.join.how == how


def test_a_join_with_a_function_still_gets_both_whole_inputs(tmp_path: Path) -> None:
    job, left, right = _two_sources()
    seen: list[tuple[int, int]] = []

    def both(a: pa.Table, b: pa.Table) -> pa.Table:
        seen.append((a.num_rows, b.num_rows))
        return a

    left.partition_by("k").join(right.partition_by("k"), both, name="j").write_parquet("o")
    step = job.vertices["j"].step
    assert step is not None and step.style == "arrow"
    context = StepContext(10, str(tmp_path), lambda: None)
    table = pa.table({"k": np.arange(95)})
    list(run_chain([step], [iter(table.to_batches(10)), iter(table.to_batches(10))], context))
    assert seen == [(95, 95)]


def test_the_join_step_runs_in_a_chain_and_counts_its_spill(tmp_path: Path) -> None:
    job, left, right = _two_sources()
    left.join(right, "k", "inner", name="j", memory=1_000).write_parquet("o")
    step = job.vertices["j"].step
    assert step is not None
    context = StepContext(64, str(tmp_path), lambda: None)
    a = pa.table({"k": np.arange(500) % 50, "a": np.arange(500)})
    b = pa.table({"k": np.arange(100), "b": np.arange(100)})
    out = pa.Table.from_batches(
        list(run_chain([step], [iter(a.to_batches(64)), iter(b.to_batches(64))], context))
    )
    assert_matches_reference(out, a, b, ("k",), "inner")
    assert context.spill.bytes > 0
