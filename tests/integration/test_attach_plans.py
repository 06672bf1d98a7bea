"""Attach mode's SetParallelism (issue 23): an unmodified application submitted with
`tailguard.spark_conf()` (the plugin and the query-stage rule) on local[2], the decider service
on the broker. Each query stage that reads shuffles Spark coalesced (a groupBy's reduce, both
sides of a sort-merge join) waits for the decider: its plan job is in the archive, the decision
is applied, the stage runs that many tasks, and the result is exact. The 3-worker cluster
version, with all five services and the replay, is in tests/e2e/test_attach_e2e.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.e2e.submitted_job import assert_planned, planned_job, spark_submit

import tailguard

pytestmark = [pytest.mark.spark, pytest.mark.tailguard_services(names=["decider"])]

ROWS, CUSTOMERS = 200_000, 5_000


def test_the_deciders_ranges_plan_a_groupby_and_both_sides_of_a_join(
    tailguard_services: Any, tailguard_broker: Any, tmp_path: Path
) -> None:
    conf = tailguard.spark_conf(
        {
            "bootstrap.servers": tailguard_broker.bootstrap,
            "tailguard.archive-dir": str(tmp_path / "archive"),
            "tailguard.work-dir": str(tmp_path / "work"),
        }
    )
    # A sort-merge join (both sides shuffled), not a broadcast of the small side.
    conf["spark.sql.autoBroadcastJoinThreshold"] = "-1"
    done = spark_submit(planned_job(ROWS, CUSTOMERS), tmp_path, conf)
    assert_planned(done, tmp_path, ROWS, CUSTOMERS)
