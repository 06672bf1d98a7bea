"""Testing your own tailguard jobs with pytest (docs/testing.md).

The pytest plugin (`tailguard.testing.plugin`, registered as a `pytest11` entry point, so it is
active wherever tailguard is installed) gives the fixtures: `tailguard_broker`,
`tailguard_cluster`, `tailguard_spark`, `tailguard_local_spark`, `tailguard_services` and the
session's `tailguard_harness`. This module gives what a test does with them:

    from tailguard.testing import run_job, assert_output_equals, assert_replay_clean

    def test_totals(tailguard_local_spark, tmp_path):
        run = run_job(build_job(data, tmp_path / "out"), tailguard_local_spark, tmp_path)
        assert_succeeded(run)
        assert_output_equals(run, reference(data), ignore_order=True)
        assert_replay_clean(run)

Importing it is cheap (no Spark, pandas or pyarrow until used): pytest loads the plugin in
every run of an environment that has tailguard, including a services-only install.
"""

from __future__ import annotations

from tailguard.testing.assertions import (
    assert_blocked,
    assert_not_blocked,
    assert_not_speculated,
    assert_output_equals,
    assert_replay_clean,
    assert_speculated,
    assert_succeeded,
)
from tailguard.testing.harness import Broker, Harness, HarnessError, Services
from tailguard.testing.jobrun import JobRun, run_job, run_settings, ship_job_code
from tailguard.testing.markers import ClusterShape, HarnessUsageError

__all__ = [
    "Broker",
    "ClusterShape",
    "Harness",
    "HarnessError",
    "HarnessUsageError",
    "JobRun",
    "Services",
    "assert_blocked",
    "assert_not_blocked",
    "assert_not_speculated",
    "assert_output_equals",
    "assert_replay_clean",
    "assert_speculated",
    "assert_succeeded",
    "run_job",
    "run_settings",
    "ship_job_code",
]
