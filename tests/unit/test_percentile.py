"""The one percentile (model/percentile.py): numpy's linear interpolation, as docs/benchmarks.md
reports p50 and p99, and what the job result's dispatch line now prints."""

from __future__ import annotations

import random
import statistics

import pytest

from tailguard.agent.driver.result import RunResult
from tailguard.model.percentile import percentile


def test_interpolates_between_the_closest_ranks() -> None:
    values = [40.0, 10.0, 30.0, 20.0]  # any order
    assert percentile(values, 50) == 25.0
    assert percentile(values, 0) == 10.0
    assert percentile(values, 100) == 40.0
    assert percentile(values, 99) == pytest.approx(39.7)
    assert percentile([7.0], 99) == 7.0


def test_matches_the_standard_librarys_inclusive_quantiles() -> None:
    # statistics.quantiles(method="inclusive") is the same definition (numpy's "linear").
    rng = random.Random(26)
    for n in (2, 3, 10, 101):
        values = [rng.uniform(0, 100) for _ in range(n)]
        cuts = statistics.quantiles(values, n=100, method="inclusive")
        for p in (1, 25, 50, 75, 99):
            assert percentile(values, p) == pytest.approx(cuts[p - 1])


def test_refuses_no_values_and_a_percentile_out_of_range() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match=r"within 0\.\.100"):
        percentile([1.0], 101)


def test_the_job_results_dispatch_line_uses_it() -> None:
    # It printed the upper middle as p50 (4.0 here) and the int(n * 0.99)-th value as p99.
    result = RunResult(
        job_id="job-1", status="SUCCEEDED", message="", started_ms=0, finished_ms=1000,
        attempts=(), parallelism={}, outputs={}, archive=None,
        dispatch_ms=(1.0, 2.0, 4.0, 8.0),
    )  # fmt: skip
    assert "dispatch overhead: p50 3.00 ms, p99 7.88 ms" in result.summary()
