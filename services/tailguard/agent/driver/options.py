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
    # Reads the fleet blocklist's changes (tailguard.agent.fleet_blocks); None: not read.
    fleet_list: Callable[[], list[FleetBlock]] | None = None
