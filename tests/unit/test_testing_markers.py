"""The pytest plugin's markers and options read into requests, and misuse named clearly."""

from __future__ import annotations

import pytest

from tailguard.testing.markers import (
    ClusterShape,
    Defaults,
    HarnessUsageError,
    cluster_request,
    read_defaults,
    services_request,
    spark_conf,
)


def test_no_marker_is_the_defaults() -> None:
    request = cluster_request((), {}, Defaults(workers=2, slow_mode="io"))
    assert request.shape == ClusterShape(2, 1, "1g")
    assert request.slow == {} and request.slow_mode == "io"


def test_a_marker_overrides_the_defaults_and_names_its_slow_hosts() -> None:
    request = cluster_request(
        (), {"workers": 3, "slow": {"127.0.0.4": 5}, "slow_mode": "io"}, Defaults()
    )
    assert request.shape.hosts() == ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    assert request.slow == {"127.0.0.4": 5.0} and request.slow_mode == "io"


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((3,), {}, "keyword arguments only"),
        ((), {"worker": 3}, "unknown argument(s) ['worker']"),
        ((), {"workers": 0}, "workers=) must be a whole number of at least 1, got 0"),
        ((), {"workers": True}, "whole number"),
        ((), {"slow": ["127.0.0.2"]}, "must map hosts to factors"),
        ((), {"slow": {"127.0.0.9": 5}}, "'127.0.0.9' is not a worker of this cluster"),
        ((), {"slow": {"127.0.0.2": 0.5}}, "at least 1 (how many times slower), got 0.5"),
        ((), {"slow": {"127.0.0.2": "x"}}, "got 'x'"),
        ((), {"workers": 1, "slow": {"127.0.0.2": 5}}, "every worker is slow"),
        ((), {"slow_mode": "disk"}, "slow_mode=) must be one of ['cpu', 'io']"),
    ],
)
def test_cluster_marker_misuse_is_named(args: tuple, kwargs: dict, message: str) -> None:
    with pytest.raises(HarnessUsageError) as err:
        cluster_request(args, kwargs, Defaults())
    assert "@pytest.mark.tailguard_cluster" in str(err.value)
    assert message in str(err.value)


def test_options_are_strings_and_blank_means_default() -> None:
    defaults = read_defaults(
        {"tailguard_workers": "2", "tailguard_worker_memory": " 512m ", "tailguard_slow_mode": ""}
    )
    assert defaults == Defaults(workers=2, memory="512m")
    with pytest.raises(HarnessUsageError, match="tailguard_workers must be a whole number"):
        read_defaults({"tailguard_workers": "two"})
    with pytest.raises(HarnessUsageError, match="tailguard_slow_mode must be one of"):
        read_defaults({"tailguard_slow_mode": "fast"})


def test_spark_conf_is_sorted_so_equal_settings_share_a_session() -> None:
    assert spark_conf((), {"conf": {"b": 2, "a": "1"}}) == (("a", "1"), ("b", "2"))
    with pytest.raises(HarnessUsageError, match="unknown argument"):
        spark_conf((), {"config": {}})


def test_services_request_keeps_service_order_and_refuses_harness_settings() -> None:
    request = services_request((), {"names": ["failover", "decider"], "settings": {"x": 1}})
    assert request.names == ("decider", "failover")
    assert request.settings == (("x", "1"),)
    assert services_request((), {}).names == (
        "detector", "speculator", "blocklist", "decider", "failover"
    )  # fmt: skip
    with pytest.raises(HarnessUsageError, match="set by the harness"):
        services_request((), {"settings": {"bootstrap.servers": "elsewhere:9092"}})
    with pytest.raises(HarnessUsageError, match=r"unknown or no service\(s\) \['nope'\]"):
        services_request((), {"names": ["nope"]})
    with pytest.raises(HarnessUsageError, match="list of service names"):
        services_request((), {"names": "decider"})
