"""Any setting from the environment: Confluent's Docker convention with the TAILGUARD_ prefix,
`<NAME>_FILE` for a value held in a file, and the first convention's names for known keys."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tailguard.cluster import slowness
from tailguard.model.config import DEFAULTS, ConfigError
from tailguard.settings_file import (
    NOT_SETTINGS,
    SHELL_DEFAULTS,
    env_key,
    env_name,
    legacy_env_name,
    load_settings,
    settings_from_env,
)


@pytest.mark.parametrize(
    ("key", "name"),
    [
        ("kafka.sasl.password", "TAILGUARD_KAFKA_SASL_PASSWORD"),
        ("s3.secret-key", "TAILGUARD_S3_SECRET__KEY"),
        ("kafka.log_level", "TAILGUARD_KAFKA_LOG___LEVEL"),
        ("schema-registry.basic.auth.user.info", "TAILGUARD_SCHEMA__REGISTRY_BASIC_AUTH_USER_INFO"),
        ("slow-task-detector.check-interval", "TAILGUARD_SLOW__TASK__DETECTOR_CHECK__INTERVAL"),
    ],
)
def test_confluent_convention(key: str, name: str) -> None:
    assert env_name(key) == name
    assert env_key(name) == key


WORD = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=1, max_size=6)
KEY = st.builds(
    lambda first, rest: first + "".join(sep + word for sep, word in rest),
    WORD,
    st.lists(st.tuples(st.sampled_from(".-_"), WORD), max_size=6),
)


@given(KEY)
def test_the_mapping_is_reversible(key: str) -> None:
    assert env_key(env_name(key)) == key


def test_every_known_key_round_trips() -> None:
    for key in (*DEFAULTS, *SHELL_DEFAULTS):
        assert env_key(env_name(key)) == key


@pytest.mark.parametrize("key", ["a..b", "a.-b", "Kafka.Linger", "a.", "_a", "a b"])
def test_keys_the_mapping_cannot_carry_are_refused(key: str) -> None:
    with pytest.raises(ConfigError, match="no environment name"):
        env_name(key)


@pytest.mark.parametrize("name", ["TAILGUARD_A____B", "TAILGUARD_A_____B"])
def test_ambiguous_underscore_runs_are_refused(name: str) -> None:
    with pytest.raises(ConfigError, match=f"{name}: .* underscores in a row are ambiguous"):
        env_key(name)


def test_any_setting_comes_from_the_environment() -> None:
    environ = {
        "TAILGUARD_KAFKA_SASL_PASSWORD": "pw",
        "TAILGUARD_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "TAILGUARD_S3_SECRET__KEY": "s3",
        "TAILGUARD_KAFKA_PRODUCER_LINGER_MS": "5",
        "OTHER_VARIABLE": "ignored",
    }
    assert settings_from_env(environ) == {
        "kafka.sasl.password": "pw",
        "kafka.security.protocol": "SASL_SSL",
        "s3.secret-key": "s3",
        "kafka.producer.linger.ms": "5",
    }


def test_the_first_conventions_names_keep_working_for_known_keys() -> None:
    environ = {
        legacy_env_name("slow-task-detector.check-interval"): "500 ms",
        "TAILGUARD_TAILGUARD_WORK_DIR": "/srv/work",  # as in compose/docker-compose.yml
        "TAILGUARD_BOOTSTRAP_SERVERS": "kafka:9092",  # the same name in both conventions
    }
    assert settings_from_env(environ) == {
        "slow-task-detector.check-interval": "500 ms",
        "tailguard.work-dir": "/srv/work",
        "bootstrap.servers": "kafka:9092",
    }


def test_both_names_for_one_key_must_agree() -> None:
    assert legacy_env_name("failover.timeout") == env_name("failover.timeout")  # no '-'
    agreeing = {legacy_env_name("tailguard.work-dir"): "w", env_name("tailguard.work-dir"): "w"}
    assert settings_from_env(agreeing) == {"tailguard.work-dir": "w"}
    differing = {legacy_env_name("tailguard.work-dir"): "w", env_name("tailguard.work-dir"): "x"}
    with pytest.raises(ConfigError, match=re.escape("both set 'tailguard.work-dir'")):
        settings_from_env(differing)


def test_a_value_from_a_file(tmp_path: Path) -> None:
    secret = tmp_path / "kafka-password"
    secret.write_text("from-a-file\n")  # the final newline of `echo` or a manifest is dropped
    environ = {"TAILGUARD_KAFKA_SASL_PASSWORD_FILE": str(secret)}
    assert settings_from_env(environ) == {"kafka.sasl.password": "from-a-file"}


def test_a_missing_value_file_names_the_variable_and_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(
        ConfigError, match=re.escape(f"TAILGUARD_S3_SECRET__KEY_FILE: cannot read '{missing}'")
    ):
        settings_from_env({"TAILGUARD_S3_SECRET__KEY_FILE": str(missing)})


def test_a_value_and_its_file_must_agree_and_conflicts_show_no_value(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("file-value-91")
    environ = {
        "TAILGUARD_KAFKA_SASL_PASSWORD": "env-value-37",
        "TAILGUARD_KAFKA_SASL_PASSWORD_FILE": str(secret),
    }
    with pytest.raises(ConfigError) as caught:
        settings_from_env(environ)
    message = str(caught.value)
    assert "TAILGUARD_KAFKA_SASL_PASSWORD and TAILGUARD_KAFKA_SASL_PASSWORD_FILE" in message
    assert "file-value-91" not in message and "env-value-37" not in message


def test_variables_that_are_not_settings(tmp_path: Path) -> None:
    assert slowness.ENV_VAR in NOT_SETTINGS
    environ = {"TAILGUARD_CONFIG": "x.toml", slowness.ENV_VAR: str(tmp_path / "absent.json")}
    assert settings_from_env(environ) == {}


def test_precedence_file_then_environment_then_extra(tmp_path: Path) -> None:
    config = tmp_path / "tailguard.toml"
    config.write_text('[kafka.sasl]\npassword = "from-toml"\nusername = "u"\n')
    settings = load_settings(
        config,
        environ={"TAILGUARD_KAFKA_SASL_PASSWORD": "from-env"},
        extra={"kafka.sasl.username": "from-flag"},
    )
    assert settings["kafka.sasl.password"] == "from-env"
    assert settings["kafka.sasl.username"] == "from-flag"


def test_the_cli_names_a_bad_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from tailguard.cli import main

    monkeypatch.setenv("TAILGUARD_A____B", "x")
    assert main(["broker", "--status", "--work-dir", str(tmp_path)]) == 2
    assert "TAILGUARD_A____B: 4 underscores in a row are ambiguous" in capsys.readouterr().err


def test_services_up_refuses_kafka_settings_faust_cannot_follow(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from tailguard.cli import main

    monkeypatch.setenv("TAILGUARD_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("TAILGUARD_KAFKA_SASL_MECHANISM", "OAUTHBEARER")
    assert main(["services", "up", "--work-dir", str(tmp_path)]) == 2
    assert "OAUTHBEARER" in capsys.readouterr().err
    assert not (tmp_path / "services").exists()  # nothing was started


def test_services_up_refuses_a_fetch_wait_that_is_no_milliseconds(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from tailguard.cli import main

    config = tmp_path / "tailguard.toml"
    config.write_text('"kafka.consumer.fetch.wait.max.ms" = "soon"\n')
    assert main(["--config", str(config), "services", "up", "--work-dir", str(tmp_path)]) == 2
    assert "kafka.consumer.fetch.wait.max.ms" in capsys.readouterr().err
    assert not (tmp_path / "services").exists()  # nothing was started


def test_replay_what_if_never_prints_a_secret(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from tailguard.archive import ArchiveWriter
    from tailguard.cli import main
    from tailguard.model import records as r

    archive = tmp_path / "job.avro"
    writer = ArchiveWriter(archive)
    graph = r.JobGraphSpec(vertices=(), edges=())
    submitted = r.JobSubmitted(job_id="j", ts=1, id="e1", name="j", graph=graph, config={})
    writer.append(r.EVENTS_TOPIC, "published", submitted, 1)
    writer.close()
    what_if = tmp_path / "what-if.toml"
    what_if.write_text('"kafka.sasl.password" = "what-if-pw-5e1"\n"decider.timeout" = "2 s"\n')
    monkeypatch.setenv("TAILGUARD_KAFKA_SASL_PASSWORD", "live-pw-0b7")
    assert main(["replay", str(archive), "--what-if", str(what_if)]) == 0
    shown = capsys.readouterr().out
    assert "what-if decider.timeout: 10 s -> 2 s" in shown
    assert "what-if kafka.sasl.password: <redacted> -> <redacted>" in shown
    assert "what-if-pw-5e1" not in shown and "live-pw-0b7" not in shown
