"""Tests of jobs/country_revenue.py with tailguard's pytest plugin.

The fixtures (`tailguard_local_spark`, `tailguard_spark`, `tailguard_services`, ...) come from
the plugin, which pytest loads because tailguard is installed; `tailguard.testing` has the
helper that runs a job and the assertions.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from jobs import country_revenue

from tailguard.testing import (
    assert_blocked,
    assert_not_blocked,
    assert_not_speculated,
    assert_output_equals,
    assert_replay_clean,
    assert_speculated,
    assert_succeeded,
    run_job,
)

COUNTRIES = ["de", "fr", "it", "es", "nl", "pl", "se", "pt"]


def write_orders(path: Path, files: int, rows: int, seed: int = 1) -> Path:
    """The day's orders: `files` Parquet files of `rows` rows, two row groups each."""
    rng = np.random.default_rng(seed)
    path.mkdir(parents=True)
    for n in range(files):
        frame = pd.DataFrame(
            {
                "order_id": np.arange(n * rows, (n + 1) * rows, dtype=np.int64),
                "country": rng.choice(COUNTRIES, size=rows),
                "amount_cents": rng.integers(100, 100_000, size=rows, dtype=np.int64),
                "refunded": rng.random(rows) < 0.05,
            }
        )
        frame.to_parquet(path / f"orders-{n:03d}.parquet", row_group_size=rows // 2)
    return path


def reference(orders: Path) -> pd.DataFrame:
    """What the job must produce, computed by pandas from the same files."""
    frame = pd.read_parquet(orders)
    frame["net_cents"] = frame["amount_cents"].where(~frame["refunded"], 0)
    grouped = frame.groupby("country").agg(
        net_cents=("net_cents", "sum"), orders=("order_id", "count")
    )
    return grouped.reset_index()


def test_totals_match_pandas(tailguard_local_spark, tmp_path: Path) -> None:
    """On `local[2]`, with the log in the job's archive and the agent deciding alone."""
    orders = write_orders(tmp_path / "orders", files=3, rows=2_000)
    job = country_revenue.build_job(orders, tmp_path / "out")

    run = run_job(job, tailguard_local_spark, tmp_path)

    assert_succeeded(run)
    assert_output_equals(run, reference(orders), ignore_order=True)
    assert_not_speculated(run)
    assert_not_blocked(run)
    assert_replay_clean(run)


# The policy scaled to a test that lasts seconds: Flink's defaults suit hour-long jobs (a task
# must run a minute before it can count as slow).
FAST_POLICY = {
    "slow-task-detector.check-interval": "500 ms",
    "slow-task-detector.execution-time.baseline-lower-bound": "1500 ms",
    "blocklist.min-slow-attempts": "1",
    "execution.batch.speculative.block-slow-node-duration": "20 s",
    "execution.batch.adaptive.auto-parallelism.avg-data-volume-per-task": "256 KiB",
    "execution.batch.adaptive.auto-parallelism.max-parallelism": "12",
}
SLOW_HOST = "127.0.0.4"
# 10x paused, not 5x: three executors share this machine's cores with the driver, the broker and
# the services, so a paused host loses less than the factor says (a "5x" host ran `price` only
# 2.3x as long as the healthy ones, seen in CI). With 5 subtasks on 3 hosts the healthy ones run
# two each, and the straggler counts as slow only once 4 of 5 finished, at about twice a healthy
# attempt's time: at 2.3x that left a fraction of a second to flag it; at 10x it is seconds.
SLOW_FACTOR = 10


@pytest.mark.slow
@pytest.mark.tailguard_cluster(workers=3, slow={SLOW_HOST: SLOW_FACTOR})
@pytest.mark.tailguard_services(settings=FAST_POLICY)
def test_a_slow_host_is_speculated_around_and_blocked(
    tailguard_spark, tailguard_services, tmp_path: Path
) -> None:
    """Three workers, one of them 10x slow, and the five services deciding: the slow host's
    tasks get speculative copies elsewhere, the host is blocked, the output is still exact,
    and replay reproduces every decision the services made."""
    orders = write_orders(tmp_path / "orders", files=8, rows=12_000)
    job = country_revenue.build_job(orders, tmp_path / "out", rounds=30_000)

    # Placement waits for every host's runner: a job started on the first (the default) could
    # end before the slow host's runner, which starts 10x slower too, joins. On a 0.1-CPU budget
    # that start (a Python worker importing tailguard) took over the default 30 s in CI, so the
    # wait here is longer.
    run = run_job(
        job,
        tailguard_spark,
        tmp_path,
        services=tailguard_services,
        settings={"tailguard.runners.min-ratio": "1", "tailguard.runners.max-wait": "180 s"},
    )

    assert_succeeded(run)
    assert_output_equals(run, reference(orders), ignore_order=True)
    assert_speculated(run, "price")
    assert_blocked(run, SLOW_HOST)
    assert_replay_clean(run)
