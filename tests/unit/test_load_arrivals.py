"""The load benchmark's arrival plans (benchmarks/load.py, `--arrivals`): when each simulated job
starts, and the window in which its decisions count. The benchmark itself is `make bench-load`.

The benchmark is not a package: its directory goes on sys.path, as when it runs as a script.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

from load import arrivals  # noqa: E402


def running_at(starts: list[float], span_s: float, t: float) -> int:
    return sum(1 for s in starts if s <= t < s + span_s)


def test_together_starts_every_job_within_one_second_and_counts_everything() -> None:
    plan = arrivals("together", 20, span_s=300.0, seed=1)
    assert len(plan.starts) == 20
    assert max(plan.starts) - min(plan.starts) < 1.0
    assert plan.window == (float("-inf"), float("inf"))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_independent_arrivals_keep_n_jobs_running_throughout_the_window(seed: int) -> None:
    span = 300.0
    plan = arrivals("independent", 20, span_s=span, seed=seed)
    assert len(plan.starts) == 40  # two jobs per agent
    lo, hi = plan.window
    assert (lo, hi) == (span, 2 * span)
    for step in range(101):
        t = lo + (hi - lo) * step / 100 - (1e-9 if step == 100 else 0.0)
        assert running_at(plan.starts, span, t) == 20
    # Independent starts: not all within a second, as `together` has them.
    firsts = sorted(plan.starts)[:20]
    assert max(firsts) - min(firsts) > 1.0


def test_independent_arrivals_follow_the_seed() -> None:
    assert arrivals("independent", 5, 100.0, seed=7) == arrivals("independent", 5, 100.0, seed=7)
    assert arrivals("independent", 5, 100.0, seed=7) != arrivals("independent", 5, 100.0, seed=8)


def test_an_unknown_arrival_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="choose from"):
        arrivals("bursty", 5, 100.0, seed=1)
