"""The demo's slow node (issue 28, item 2): its work is I/O-bound, slowed by the host's factor,
and what the slow node costs its tasks is read from the tasks' times per host."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from tailguard import demo
from tailguard.cluster import slowness
from tailguard.examples import sales_by_region as example


def _rows(n: int) -> pa.Table:
    return pa.table({"quantity": [1] * n, "price_cents": [100] * n})


def test_fetch_waits_per_row_at_the_hosts_factor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wait is the rows' healthy-host seconds, done at the factor of the host's file."""
    path = slowness.slowness_file(tmp_path, "127.0.0.4")
    slowness.write(path, 5.0)
    monkeypatch.setenv(slowness.ENV_VAR, str(path))
    asked: list[tuple[float, float]] = []

    def io_work(seconds: float, **_: object) -> float:
        asked.append((seconds, slowness.host_factor()))
        return seconds

    monkeypatch.setattr(example, "io_work", io_work)
    table = _rows(300)
    assert example.fetch(table, 0.002) is table
    assert asked == [(pytest.approx(0.6), 5.0)]
    example.fetch(_rows(0), 0.002)
    example.fetch(table, 0.0)
    assert len(asked) == 1, "no rows, or no I/O work: no wait"


def test_slow_node_cost_is_the_ratio_of_mean_task_times() -> None:
    by_host = {"127.0.0.2": [2.0, 4.0], "127.0.0.3": [3.0], "127.0.0.4": [12.0, 15.0]}
    assert demo.slow_node_cost(by_host, "127.0.0.4") == pytest.approx(13.5 / 3.0)
    assert demo.slow_node_cost(by_host, "127.0.0.9") is None  # it ran nothing
    assert demo.slow_node_cost({"127.0.0.4": [1.0]}, "127.0.0.4") is None  # nothing else did
