"""One duration parser (`model/config.py`): a bare number keeps the unit its input always had,
milliseconds in settings (as in Flink) and seconds in `tailguard cluster throttle --for`."""

from __future__ import annotations

import argparse

import pytest

from tailguard.cluster import cluster_cli
from tailguard.cluster.throttle import parse_duration
from tailguard.model.config import ConfigError, Settings, parse_duration_ms


def test_a_bare_number_in_a_setting_is_milliseconds() -> None:
    assert parse_duration_ms("500") == 500
    assert parse_duration_ms("1.5") == 2  # rounded to the millisecond
    key = "execution.batch.speculative.block-slow-node-duration"
    assert Settings({key: "90000"}).duration_ms(key) == 90_000  # an old file: 90 s, as before
    assert Settings({key: "90 s"}).duration_ms(key) == 90_000


def test_units_mean_the_same_whatever_the_bare_unit() -> None:
    for text, ms in (("500 ms", 500), ("30s", 30_000), ("2 min", 120_000), ("1h", 3_600_000)):
        assert parse_duration_ms(text) == ms
        assert parse_duration_ms(text, bare_unit="s") == ms
        assert parse_duration(text) == ms / 1000


def test_a_bare_number_for_the_throttle_is_seconds() -> None:
    assert parse_duration_ms("30", bare_unit="s") == 30_000
    assert parse_duration("30") == 30.0  # `--for 30`: 30 s, as it always was
    assert parse_duration("0.25") == 0.25
    assert parse_duration("2m") == 120.0  # the throttle's minutes, as before


def test_bad_durations_are_named() -> None:
    with pytest.raises(ConfigError, match="not a duration: '-5'"):
        parse_duration("-5")
    with pytest.raises(ConfigError, match="unknown duration unit 'fortnight'"):
        parse_duration_ms("2 fortnight")
    with pytest.raises(ValueError, match="unknown unit for a bare number"):
        parse_duration_ms("5", bare_unit="parsec")
    with pytest.raises(argparse.ArgumentTypeError, match="bad duration 'soon'"):
        cluster_cli._duration("soon")
