"""Loading settings: one TOML file plus environment overrides (the shell side of model.config).

TOML may nest tables or use quoted dotted keys; both flatten to Flink's dotted key names:

    [slow-task-detector.execution-time]
    baseline-lower-bound = "30 s"

**Any** setting can come from the environment, named by Confluent's Docker convention with the
prefix `TAILGUARD_`: the key upper-cased, `.` -> `_`, `-` -> `__`, `_` -> `___`
(`kafka.sasl.password` -> TAILGUARD_KAFKA_SASL_PASSWORD, `s3.secret-key` ->
TAILGUARD_S3_SECRET__KEY, `kafka.log_level` -> TAILGUARD_KAFKA_LOG___LEVEL). The mapping is
reversible for every key in which no two of `.`, `-`, `_` stand side by side (all of Flink's,
librdkafka's and tailguard's keys); `env_name` refuses other keys.

`<NAME>_FILE` names a file holding the value instead (the Docker and Kubernetes secrets
convention: TAILGUARD_KAFKA_SASL_PASSWORD_FILE=/run/secrets/kafka-password), so a secret need be
neither in the settings file nor in the environment.

The names of the first convention (the key upper-cased with `.` and `-` both turned into `_`,
TAILGUARD_SLOW_TASK_DETECTOR_CHECK_INTERVAL) keep working for the keys tailguard knows.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tailguard.model.config import DEFAULTS, ConfigError, Settings

DEFAULT_FILE = "tailguard.toml"
ENV_FILE = "TAILGUARD_CONFIG"
ENV_PREFIX = "TAILGUARD_"
FILE_SUFFIX = "_FILE"

# Settings that are not policy keys but that the shells read (Kafka, registry, storage).
SHELL_DEFAULTS: dict[str, str] = {
    "bootstrap.servers": "",
    "schema-registry.url": "",
    "tailguard.work-dir": "work",
    "tailguard.archive-dir": "work/archive",
}

# TAILGUARD_ variables that are not settings: the settings file itself, and the file through
# which `tailguard cluster` tells a worker's executors how slow their node is
# (tailguard.cluster.slowness.ENV_VAR; not imported, to keep the cluster out of the services).
NOT_SETTINGS = frozenset({ENV_FILE, "TAILGUARD_SLOWNESS_FILE"})

# A key the environment mapping can carry: lower-case words joined by single separators.
_MAPPABLE_KEY = re.compile(r"[a-z0-9]+(?:[._-][a-z0-9]+)*")
_TO_ENV = {".": "_", "-": "__", "_": "___"}
_FROM_ENV = {1: ".", 2: "-", 3: "_"}
_UNDERSCORES = re.compile(r"_+")


def env_name(key: str) -> str:
    """The environment variable that sets `key` (Confluent's convention, prefix TAILGUARD_)."""
    if not _MAPPABLE_KEY.fullmatch(key):
        raise ConfigError(
            f"setting {key!r} has no environment name: only lower-case keys whose words are "
            "joined by single '.', '-' or '_' can be set from the environment"
        )
    return ENV_PREFIX + "".join(_TO_ENV.get(c, c) for c in key).upper()


def env_key(name: str) -> str:
    """The setting an environment variable sets: the inverse of `env_name`."""
    if not name.startswith(ENV_PREFIX) or len(name) == len(ENV_PREFIX):
        raise ConfigError(f"{name}: not a {ENV_PREFIX}<KEY> variable")
    body = name[len(ENV_PREFIX) :]
    if body.startswith("_") or body.endswith("_"):
        raise ConfigError(f"{name}: a key cannot start or end with a separator")

    def separator(run: re.Match[str]) -> str:
        found = _FROM_ENV.get(len(run.group()))
        if found is None:
            raise ConfigError(
                f"{name}: {len(run.group())} underscores in a row are ambiguous "
                "('_' is '.', '__' is '-', '___' is '_')"
            )
        return found

    return _UNDERSCORES.sub(separator, body).lower()


def legacy_env_name(key: str) -> str:
    """The first convention's name for `key`: `.` and `-` both `_` (lossy, so only for keys
    tailguard knows)."""
    return ENV_PREFIX + key.upper().replace(".", "_").replace("-", "_")


def _read_value_file(variable: str, path: str) -> str:
    try:
        text = Path(path).read_text()
    except OSError as err:
        # The path is named, never the content: the file holds a secret.
        raise ConfigError(f"{variable}: cannot read {path!r}: {err.strerror}") from None
    # Secret files are often written with a final newline (`echo`, Kubernetes manifests); a
    # value never ends with one.
    return text[:-1] if text.endswith("\n") else text


def settings_from_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The settings the `TAILGUARD_*` variables of `environ` set, `<NAME>_FILE` ones read from
    their files. Two variables that set one key to different values are an error."""
    legacy = {legacy_env_name(k): k for k in (*DEFAULTS, *SHELL_DEFAULTS)}
    values: dict[str, str] = {}
    origin: dict[str, str] = {}
    for variable in sorted(environ):
        if not variable.startswith(ENV_PREFIX) or variable in NOT_SETTINGS:
            continue
        name = variable.removesuffix(FILE_SUFFIX)
        key = legacy.get(name) or env_key(name)
        value = environ[variable]
        if name != variable:
            value = _read_value_file(variable, value)
        if key in values and values[key] != value:
            # No values in the message: either may be a secret.
            raise ConfigError(
                f"{origin[key]} and {variable} both set {key!r}, to different values; set only one"
            )
        values[key] = value
        origin[key] = variable
    return values


def _flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    flat: dict[str, str] = {}
    for key, value in table.items():
        full = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            flat.update(_flatten(value, full))
        elif isinstance(value, bool):
            flat[full] = "true" if value else "false"
        else:
            flat[full] = str(value)
    return flat


def read_toml(path: str | Path) -> dict[str, str]:
    path = Path(path)
    try:
        with path.open("rb") as handle:
            return _flatten(tomllib.load(handle))
    except FileNotFoundError:
        raise ConfigError(f"settings file not found: {path}") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from None


def load_settings(
    path: str | Path | None = None,
    environ: Mapping[str, str] | None = None,
    extra: Mapping[str, str] | None = None,
) -> Settings:
    """Defaults <- TOML file <- environment <- `extra` (e.g. command-line flags)."""
    environ = os.environ if environ is None else environ
    values: dict[str, str] = dict(SHELL_DEFAULTS)
    chosen = path or environ.get(ENV_FILE)
    if chosen:
        values.update(read_toml(chosen))
    elif Path(DEFAULT_FILE).is_file():
        values.update(read_toml(DEFAULT_FILE))
    values.update(settings_from_env(environ))
    if extra:
        values.update(extra)
    return Settings(values)
