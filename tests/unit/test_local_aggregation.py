"""Two-phase aggregation: the producers' local phase (`partial_states`) and the consumers'
merge give exactly the one-phase result, a hot key crosses the exchange as a few state rows,
and the plan runs the local phase only where every consumer can merge it."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from agent_fakes import FakeRuntime, Harness, run_all
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.examples_budget import examples

from tailguard.agent.driver.local_aggregation import strategy_of
from tailguard.agent.driver.state import ExecutionState
from tailguard.agent.executor.aggregation import (
    Aggregation,
    LocalPhase,
    aggregate_batches,
    partial_states,
)
from tailguard.agent.executor.storage import Storage
from tailguard.agent.graph.api import Job
from tailguard.agent.graph.chaining import chain
from tailguard.model import records as r
from tailguard.model.config import ConfigError, Settings

AGGREGATIONS = (
    Aggregation("total", "qty", "sum"),
    Aggregation("rows", "*", "count"),
    Aggregation("amounts", "amount", "count"),
    Aggregation("low", "amount", "min"),
    Aggregation("high", "qty", "max"),
    Aggregation("mean_amount", "amount", "mean"),
)
PHASE = LocalPhase(("k",), AGGREGATIONS, "agg")


def _one_phase(batches: list[pa.RecordBatch], rows: int) -> pa.Table:
    return pa.Table.from_batches(list(aggregate_batches(batches, ("k",), AGGREGATIONS, rows, "t")))


def _two_phase(producers: list[list[pa.RecordBatch]], flush: int, rows: int) -> pa.Table:
    states = [s for batches in producers for s in partial_states(batches, PHASE, flush)]
    merged = aggregate_batches(states, ("k",), AGGREGATIONS, rows, "t", merging=True)
    return pa.Table.from_batches(list(merged))


def _table(keys: list[int | None], qty: list[int | None], amount: list[float | None]) -> pa.Table:
    return pa.table(
        {
            "k": pa.array(keys, pa.int64()),
            "qty": pa.array(qty, pa.int64()),
            "amount": pa.array(amount, pa.float64()),
        }
    )


rows_strategy = st.lists(
    st.tuples(
        st.one_of(st.none(), st.integers(0, 6)),
        st.one_of(st.none(), st.integers(-50, 50)),
        st.one_of(st.none(), st.integers(-1000, 1000).map(lambda v: v / 8)),
    ),
    min_size=1,
    max_size=120,
)


@settings(max_examples=examples(300), deadline=None)
@given(
    rows=rows_strategy,
    cuts=st.lists(st.integers(0, 120), max_size=8),
    producers=st.integers(1, 4),
    flush=st.integers(1, 20),
)
def test_two_phases_give_the_one_phase_result(
    rows: list[tuple[Any, Any, Any]], cuts: list[int], producers: int, flush: int
) -> None:
    """Whatever the batches, the producers and the flush bound: the same rows, keys (nulls
    grouped as one key, as Spark's groupBy) and values (nulls skipped) as one phase. Amounts
    are multiples of 1/8, so float sums are exact in any order."""
    table = _table(*map(list, zip(*rows, strict=True)))
    bounds = sorted({0, table.num_rows, *(c for c in cuts if c < table.num_rows)})
    batches = [
        b for start, end in pairwise(bounds) for b in table.slice(start, end - start).to_batches()
    ]
    shares = [batches[p::producers] for p in range(producers)]
    # One phase over one batch: one partial state, no merge (the merge is under test).
    expected = _one_phase(table.combine_chunks().to_batches(), table.num_rows)
    got = _two_phase(shares, flush, 7)
    assert got.equals(expected), f"{got.to_pandas()}\n!=\n{expected.to_pandas()}"


def test_a_hot_key_leaves_a_producer_as_one_state_row() -> None:
    hot = _table([3] * 1_000, list(range(1_000)), [1.0] * 1_000)
    states = list(partial_states(hot.to_batches(max_chunksize=100), PHASE, 50))
    assert sum(s.num_rows for s in states) == 1
    (state,) = states
    assert state.column("_0_sum").to_pylist() == [sum(range(1_000))]


def test_keys_that_do_not_repeat_are_passed_on_within_the_flush_bound() -> None:
    # 5,000 distinct keys: holding them gains nothing, so states leave in flushes, none of
    # them longer than the bound, and every key once.
    unique = _table(list(range(5_000)), [1] * 5_000, [2.0] * 5_000)
    states = list(partial_states(unique.to_batches(max_chunksize=100), PHASE, 300))
    assert max(s.num_rows for s in states) <= 300
    assert sorted(k for s in states for k in s.column("k").to_pylist()) == list(range(5_000))


def test_a_consumer_given_rows_where_it_expects_states_says_so() -> None:
    rows = _table([1, 2], [1, 2], [1.0, 2.0]).to_batches()
    with pytest.raises(ValueError, match="holds no partial state column"):
        list(aggregate_batches(rows, ("k",), AGGREGATIONS, 10, "operator 'agg'", merging=True))


# ---------------------------------------------------------------------------------- the plan


def _job(extra_consumer: bool = False) -> Job:
    job = Job("plan")
    src = job.read_parquet("in", name="src")
    src.partition_by("k").aggregate(total=("qty", "sum"), name="agg").write_parquet(
        "out", name="sink"
    )
    if extra_consumer:
        src.partition_by("k").map(lambda t: t, name="rows").write_parquet("out2", name="sink2")
    return job


def test_a_producer_whose_consumers_all_aggregate_runs_the_local_phase() -> None:
    graph = chain(_job())
    plan = ExecutionState(graph, 8).local_aggregation
    phase = plan.phase("src")
    assert phase is not None and phase.keys == ("k",) and phase.operator == "agg"
    (consumer,) = [c for c in graph.vertices.values() if c.steps and c.steps[0].name == "agg"]
    assert plan.step(consumer.name, consumer.steps[0]).merging
    assert plan.phase(consumer.name) is None  # the aggregation's own output is rows


def test_one_phase_or_a_consumer_that_needs_rows_keeps_rows() -> None:
    assert (
        ExecutionState(chain(_job()), 8, agg_phase="ONE_PHASE").local_aggregation.phase("src")
        is None
    )
    graph = chain(_job(extra_consumer=True))
    plan = ExecutionState(graph, 8).local_aggregation
    assert plan.phase("src") is None
    assert not any(plan.step(c.name, s).merging for c in graph.vertices.values() for s in c.steps)


def test_the_strategy_takes_flinks_values_in_any_case_and_refuses_others() -> None:
    key = "table.optimizer.agg-phase-strategy"
    assert strategy_of(Settings({})) == "AUTO"
    assert strategy_of(Settings({key: "one_phase"})) == "ONE_PHASE"
    with pytest.raises(ConfigError, match="must be one of AUTO, TWO_PHASE, ONE_PHASE"):
        strategy_of(Settings({key: "three"}))


# ------------------------------------------------------------------------------- a whole job

HOT = 7


def _hot_input(path: Path) -> Path:
    """4 files: 400 rows over 200 keys each, plus 4,000 rows of key HOT."""
    rng = np.random.default_rng(5)
    path.mkdir(parents=True)
    for f in range(4):
        keys = np.concatenate([rng.integers(0, 200, 400), np.full(4_000, HOT)])
        pq.write_table(
            pa.table(
                {"k": keys, "qty": rng.integers(0, 100, len(keys)), "x": rng.random(len(keys))}
            ),
            path / f"part-{f}.parquet",
        )
    return path


@pytest.mark.parametrize("strategy", ["AUTO", "ONE_PHASE"])
def test_a_hot_key_no_longer_skews_the_aggregation_and_the_output_is_exact(
    tmp_path: Path, strategy: str
) -> None:
    data = _hot_input(tmp_path / "in")
    job = Job("hot")
    job.read_parquet(str(data), name="src", parallelism=4).partition_by("k").aggregate(
        total=("qty", "sum"), rows=("*", "count"), mean_x=("x", "mean"), name="agg"
    ).write_parquet(str(tmp_path / "out"), name="sink")
    settings = {
        "table.optimizer.agg-phase-strategy": strategy,
        "execution.batch.adaptive.auto-parallelism.max-parallelism": "8",
    }
    h = Harness(job, FakeRuntime.hosts(h1=2), Storage(str(tmp_path / "st")), settings=settings)
    h.start()
    result = run_all(h)
    # The run says where it aggregated before the exchange.
    two_phase = strategy == "AUTO"
    assert result.local_aggregation == ({"src": "agg"} if two_phase else {})
    assert ("aggregated for agg before its exchange" in result.summary()) == two_phase

    got = pq.read_table(tmp_path / "out").to_pandas().sort_values("k", ignore_index=True)
    whole = pq.read_table(data).to_pandas()
    expected = (
        whole.groupby("k")
        .agg(total=("qty", "sum"), rows=("qty", "size"), mean_x=("x", "mean"))
        .reset_index()
    )
    pd.testing.assert_frame_equal(got, expected, check_exact=False, rtol=1e-12)

    produced = [
        e.bytes_per_subpartition for e in h.publisher.of(r.AttemptFinished) if e.vertex == "src"
    ]
    sizes = sorted(sum(column) for column in zip(*produced, strict=True))
    median = sizes[len(sizes) // 2]
    if strategy == "AUTO":
        # Flink's skew rule (4x the median) finds nothing to split.
        assert sizes[-1] < 4 * median, sizes
    else:
        assert sizes[-1] >= 10 * median, sizes
