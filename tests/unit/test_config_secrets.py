"""Which settings are secret, how they are shown, and what a `JobSubmitted` record may carry."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_fakes import QUIET, FakeRuntime, Harness, write_parquet_input
from hypothesis import given
from hypothesis import strategies as st

from tailguard.agent.driver.ports import Post
from tailguard.agent.executor.storage import Storage
from tailguard.agent.graph.api import Job
from tailguard.model import records as r
from tailguard.model.config import (
    DEFAULTS,
    RECORDED_MARKERS,
    REDACTED,
    SERVICES_KEY,
    Settings,
    is_secret,
    recorded_config,
    redacted,
)

SECRET_KEYS = [
    "kafka.sasl.password",
    "kafka.producer.sasl.password",
    "kafka.sasl.oauthbearer.client.secret",
    "kafka.sasl.oauthbearer.config",
    "kafka.sasl.jaas.config",
    "kafka.ssl.key.password",
    "kafka.ssl.keystore.password",
    "kafka.ssl.key.pem",
    "kafka.ssl_key",
    "schema-registry.basic.auth.user.info",
    "schema-registry.bearer.auth.token",
    "s3.access-key",
    "s3.secret-key",
    "security.command-signing.key",
    "security.command-signing.previous-keys",
    "some.api-key",
    "service.client-secret",
]
PLAIN_KEYS = [
    "bootstrap.servers",
    "kafka.security.protocol",
    "kafka.sasl.mechanism",
    "kafka.sasl.username",
    "kafka.ssl.ca.location",
    "kafka.ssl.certificate.location",
    "kafka.ssl.key.location",  # a path to a key file, not the key
    "schema-registry.url",
    "s3.endpoint",
    "tailguard.work-dir",
    "keyboard.layout",
    "monkey",
    "turnkeys",
]


@pytest.mark.parametrize("key", SECRET_KEYS)
def test_secret_keys(key: str) -> None:
    assert is_secret(key)


@pytest.mark.parametrize("key", [*PLAIN_KEYS, *DEFAULTS, *RECORDED_MARKERS])
def test_keys_that_are_not_secret(key: str) -> None:
    assert not is_secret(key)


def test_redacted_keeps_keys_and_hides_secret_values() -> None:
    values = {"kafka.sasl.password": "hunter2", "kafka.sasl.username": "svc"}
    assert redacted(values) == {"kafka.sasl.password": REDACTED, "kafka.sasl.username": "svc"}


def test_settings_repr_shows_no_secret() -> None:
    settings = Settings(
        {"kafka.sasl.password": "hunter2-3c9", "decider.timeout": "3 s", "s3.secret-key": "zz9"}
    )
    shown = f"{settings!r} {settings}"
    assert "hunter2-3c9" not in shown and "zz9" not in shown
    assert "decider.timeout" in shown and "3 s" in shown and REDACTED in shown


def test_recorded_config_keeps_policy_settings_and_markers_only() -> None:
    values = {
        "decider.timeout": "3 s",
        SERVICES_KEY: "on",
        "bootstrap.servers": "kafka:9093",
        "kafka.sasl.password": "pw",
        "schema-registry.url": "https://registry",
        "schema-registry.basic.auth.user.info": "u:p",
        "tailguard.work-dir": "/srv/work",
        "tailguard.archive-dir": "s3://bucket/archive",
        "security.command-signing.key": "k",
        "s3.secret-key": "s",
    }
    assert recorded_config(values) == {"decider.timeout": "3 s", SERVICES_KEY: "on"}


SETTING_KEY = st.one_of(
    st.sampled_from([*DEFAULTS, *RECORDED_MARKERS, *SECRET_KEYS, *PLAIN_KEYS]),
    st.from_regex(r"(tailguard|kafka|s3)\.[a-z.-]{1,20}", fullmatch=True),
)


@given(st.dictionaries(SETTING_KEY, st.text(max_size=5)))
def test_a_recorded_config_never_holds_a_connection_setting_or_secret(
    values: dict[str, str],
) -> None:
    recorded = recorded_config(values)
    assert set(recorded) <= set(DEFAULTS) | RECORDED_MARKERS
    assert not any(is_secret(k) for k in recorded)
    assert all(recorded[k] == values[k] for k in recorded)


class NoRunners(FakeRuntime):
    """The job ends right after JobSubmitted: enough to see what the driver records."""

    def start(self, job_id: str, post: Post) -> int:
        raise OSError("no runners in this test")


def test_the_driver_records_only_policy_settings(tmp_path: Path) -> None:
    job = Job("one")
    job.read_parquet(str(write_parquet_input(tmp_path / "in.parquet")), name="src").write_parquet(
        str(tmp_path / "out"), name="out"
    )
    planted = {
        "kafka.sasl.password": "planted-pw",
        "bootstrap.servers": "kafka:9093",
        "tailguard.archive-dir": str(tmp_path / "archive"),
        "security.command-signing.key": "planted-key",
        "decider.timeout": "7 s",
    }
    h = Harness(job, NoRunners([]), Storage(str(tmp_path / "st")), settings=planted).start()
    h.result()
    submitted = h.publisher.events[0]
    assert isinstance(submitted, r.JobSubmitted)
    assert submitted.config == {**QUIET, "decider.timeout": "7 s", SERVICES_KEY: "off"}
