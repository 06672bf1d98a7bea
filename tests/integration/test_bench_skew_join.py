"""The bench's skew scenario job (issue 27) on `local[2]`, both engines, without the waits.

tailguard: the hot subpartition is split into pieces (the decider's `SetParallelism` with
`skew_splits`, applied) and the sums equal the pandas reference; with the strategy none it is
not split. Plain PySpark with the scenario's SQL settings: AQE's skew join splits it too (the
final plan's sort-merge join is a skew join), with the same sums; so the bench compares the two
splitting mechanisms, not one engine splitting against one that does not.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tailguard.bench import report, skew_join
from tailguard.bench.scenarios import (
    FULL,
    IO_FULL,
    IO_JOB_SETTINGS,
    NO_SKEW_SPLIT_CONTENDER,
    policy_for,
    select_contenders,
)
from tailguard.examples import sales_by_region as example
from tailguard.model import records as r
from tailguard.testing import run_job

pytestmark = pytest.mark.spark
# The bench's size and policy, without the waits: what the bench runs is what splits here.
SIZE = replace(skew_join.SKEW_SIZE, subpartition_s=0.0)
POLICY = policy_for(FULL, IO_FULL)


@pytest.mark.parametrize("split", [True, False], ids=["split", "strategy-none"])
def test_the_tailguard_job_splits_the_hot_key_and_sums_exactly(
    tailguard_local_spark: Any, tmp_path: Path, split: bool
) -> None:
    data = skew_join.generate(tmp_path / "data", SIZE)
    output = tmp_path / "out"
    (unsplit,) = select_contenders(NO_SKEW_SPLIT_CONTENDER)
    settings = {
        **POLICY,
        **IO_JOB_SETTINGS,
        **skew_join.tailguard_settings(),
        **({} if split else dict(unsplit.job_settings)),
    }
    run = run_job(
        skew_join.tailguard_job(data, output, SIZE),
        tailguard_local_spark,
        tmp_path,
        settings=settings,
    )
    assert run.ok, run.result.message
    pieces = report.skew_pieces(run.records)
    if split:
        assert pieces > 1
        (decision,) = [
            c for c in run.of(r.SetParallelism) if c.vertex.startswith(skew_join.JOIN_VERTEX)
        ]
        assert [s.input for s in decision.skew_splits] == [skew_join.ORDERS]
    else:
        assert pieces == 0
    expected = skew_join.reference(data)
    actual = example.read_output(output)
    assert expected.equals(actual[expected.columns.tolist()])


def test_the_plain_job_is_an_aqe_skew_join_and_sums_exactly(
    tailguard_local_spark: Any, tmp_path: Path
) -> None:
    data = skew_join.generate(tmp_path / "data", SIZE)
    totals = skew_join.plain_frame(tailguard_local_spark, data, SIZE)
    rows = totals.toPandas().sort_values("region").reset_index(drop=True)
    plan = totals._jdf.queryExecution().executedPlan().toString()
    assert "isFinalPlan=true" in plan
    assert "skew=true" in plan, plan
    expected = skew_join.reference(data)
    assert expected.equals(rows[expected.columns.tolist()].astype(expected.dtypes.to_dict()))
