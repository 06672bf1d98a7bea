"""How a job is run: the choices its caller makes (services, storage, progress, waiting); what
a test does to a running job is `hooks.JobHooks`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tailguard.agent.executor.storage import Storage
from tailguard.model.config import ConfigError, Settings, parse_duration_ms
from tailguard.model.fleet import FleetBlock

RUNNERS_MIN_RATIO = "tailguard.runners.min-ratio"
RUNNERS_MAX_WAIT = "tailguard.runners.max-wait"
DEFAULT_RUNNERS_MAX_WAIT_S = 30.0


@dataclass
class RunOptions:
    services: bool = True
    storage: Storage | None = None
    progress: bool = True
    executor_wait_s: float = 60.0
    # Placement waits for this share of the runners launched to connect, at most
    # `runners_max_wait_s` after the first did (Spark's minRegisteredResourcesRatio and
    # maxRegisteredResourcesWaitingTime); 0: it starts on the first (`Lifecycle.await_runners`).
    runners_min_ratio: float = 0.0
    runners_max_wait_s: float = DEFAULT_RUNNERS_MAX_WAIT_S
    # Reads the fleet blocklist's changes (tailguard.agent.fleet_blocks); None: not read.
    fleet_list: Callable[[], list[FleetBlock]] | None = None


def runner_wait(settings: Settings) -> tuple[float, float]:
    """`runners_min_ratio` and `runners_max_wait_s` from `tailguard.runners.min-ratio` (0-1,
    default 0: start on the first) and `tailguard.runners.max-wait` (a duration)."""
    raw = (settings.get(RUNNERS_MIN_RATIO) or "0").strip()
    try:
        ratio = float(raw)
    except ValueError:
        ratio = -1.0
    if not 0.0 <= ratio <= 1.0:
        raise ConfigError(f"{RUNNERS_MIN_RATIO}: expected a share from 0 to 1, got {raw!r}")
    raw_wait = settings.get(RUNNERS_MAX_WAIT)
    if not raw_wait:
        return ratio, DEFAULT_RUNNERS_MAX_WAIT_S
    try:
        return ratio, parse_duration_ms(raw_wait.strip()) / 1000.0
    except ConfigError as err:
        raise ConfigError(f"{RUNNERS_MAX_WAIT}: {err}") from None
