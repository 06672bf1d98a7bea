"""`tailguard.runners.min-ratio` and `tailguard.runners.max-wait`: how long placement waits for
slot runners (Spark's minRegisteredResourcesRatio and maxRegisteredResourcesWaitingTime)."""

from __future__ import annotations

import pytest

from tailguard.agent.driver.options import runner_wait
from tailguard.model.config import ConfigError, Settings


def test_by_default_placement_starts_on_the_first_runner() -> None:
    assert runner_wait(Settings({})) == (0.0, 30.0)


def test_a_share_and_a_wait_are_read() -> None:
    settings = Settings(
        {"tailguard.runners.min-ratio": "0.5", "tailguard.runners.max-wait": "2 min"}
    )
    assert runner_wait(settings) == (0.5, 120.0)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("tailguard.runners.min-ratio", "1.5"),
        ("tailguard.runners.min-ratio", "all"),
        ("tailguard.runners.max-wait", "soon"),
    ],
)
def test_a_bad_value_is_refused_naming_its_key(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        runner_wait(Settings({key: value}))
