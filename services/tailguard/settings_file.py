"""Loading settings: one TOML file plus environment overrides (the shell side of model.config).

TOML may nest tables or use quoted dotted keys; both flatten to Flink's dotted key names:

    [slow-task-detector.execution-time]
    baseline-lower-bound = "30 s"

An environment variable overrides a known key: the key upper-cased with `.` and `-` turned into
`_`, prefixed with `TAILGUARD_` (TAILGUARD_SLOW_TASK_DETECTOR_CHECK_INTERVAL=500ms).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tailguard.model.config import DEFAULTS, ConfigError, Settings

DEFAULT_FILE = "tailguard.toml"
ENV_FILE = "TAILGUARD_CONFIG"

# Settings that are not policy keys but that the shells read (Kafka, registry, storage).
SHELL_DEFAULTS: dict[str, str] = {
    "bootstrap.servers": "",
    "schema-registry.url": "",
    "tailguard.work-dir": "work",
    "tailguard.archive-dir": "work/archive",
}


def env_name(key: str) -> str:
    return "TAILGUARD_" + key.upper().replace(".", "_").replace("-", "_")


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
    for key in (*DEFAULTS, *SHELL_DEFAULTS):
        name = env_name(key)
        if name in environ:
            values[key] = environ[name]
    if extra:
        values.update(extra)
    return Settings(values)
