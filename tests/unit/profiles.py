"""Run a test module under both of tailguard's detector profiles.

Import `both_profiles` into a module (`from profiles import both_profiles  # noqa: F401`) and
each of its tests runs twice: with tailguard's defaults, and with FLIP-168's rules exactly
(`model.config.FLIP_168` over the defaults, so every `Settings()` the test builds has them).
Flink's scenarios must hold under both: the slow-host rule only speaks from progress reports.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tailguard.model.config import DEFAULTS, FLIP_168


@pytest.fixture(autouse=True, params=["tailguard", "flip-168"])
def both_profiles(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "flip-168":
        for key, value in FLIP_168.items():
            monkeypatch.setitem(DEFAULTS, key, value)
    yield request.param
