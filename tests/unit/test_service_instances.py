"""The instances of a service: names, and how many of each `services up --instances N` runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tailguard.shell.instances import (
    InstancesError,
    announced,
    instance_name,
    service_of,
    wanted,
)


def test_instance_names_name_their_service() -> None:
    assert instance_name("detector", 1) == "detector"
    assert instance_name("detector", 2) == "detector-2"
    assert service_of("detector") == "detector"
    assert service_of("detector-12") == "detector"
    # Not an instance: no such service, no number, or the first one's number written out.
    assert service_of("detectors-2") is None
    assert service_of("detector-x") is None
    assert service_of("detector-1") is None
    assert service_of("broker") is None


def test_announced_instances_in_the_tables_order() -> None:
    files = [Path(f"{n}.json") for n in ("decider-10", "blocklist", "decider", "x", "decider-2")]
    assert announced(files) == ["blocklist", "decider", "decider-2", "decider-10"]


def test_the_blocklist_runs_one_instance() -> None:
    told: list[str] = []
    assert wanted(["decider", "blocklist"], 3, told.append) == [
        ("decider", 1),
        ("decider", 2),
        ("decider", 3),
        ("blocklist", 1),
    ]
    assert len(told) == 1 and told[0].startswith("blocklist: one instance only: its fleet view")
    told.clear()
    assert wanted(["blocklist"], 1, told.append) == [("blocklist", 1)]
    assert not told


def test_at_least_one_instance() -> None:
    with pytest.raises(InstancesError, match="at least 1"):
        wanted(["decider"], 0, print)
