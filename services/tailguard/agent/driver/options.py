"""How a job is run: the choices its caller makes (services, storage, progress, waiting); what
a test does to a running job is `hooks.JobHooks`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tailguard.agent.executor.storage import Storage
from tailguard.model.fleet import FleetBlock


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
    runners_max_wait_s: float = 30.0
    # Reads the fleet blocklist's changes (tailguard.agent.fleet_blocks); None: not read.
    fleet_list: Callable[[], list[FleetBlock]] | None = None
