"""Shared test setup: a test marked `spark` is skipped, with the reason, where no usable Java is
installed (Spark needs a full JDK 17+), so a test module only declares `pytest.mark.spark`.

The embedded broker, the local clusters, the Spark sessions and the services come from
tailguard's own pytest plugin (`tailguard.testing`, loaded through its pytest11 entry point;
docs/testing.md), shared by the whole run: `tailguard_local_spark`, `tailguard_spark`,
`tailguard_cluster`, `tailguard_services`, `tailguard_broker`, and `tailguard_harness` for
module fixtures."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    spark_tests = [item for item in items if item.get_closest_marker("spark") is not None]
    if not spark_tests:
        return
    from tailguard.cluster.local import ClusterError, find_java

    try:
        find_java()
    except ClusterError as missing:
        skip = pytest.mark.skip(reason=str(missing))
        for item in spark_tests:
            item.add_marker(skip)
