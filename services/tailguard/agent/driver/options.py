"""How a job is run: the choices its caller makes (services, storage, progress, waiting)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tailguard.agent.executor.storage import Storage
from tailguard.model import records as r
from tailguard.model.fleet import FleetBlock

if TYPE_CHECKING:
    from tailguard.agent.driver.driver import JobDriver


@dataclass
class RunOptions:
    services: bool = True
    storage: Storage | None = None
    progress: bool = True
    # Test hooks that inject real failures: {(chain, subtask, attempt): message}
    fail_attempts: dict[tuple[str, int, int], str] = field(default_factory=dict)
    # Called with each event after publishing (tests, the demo's live view).
    on_event: Callable[[r.Event], None] | None = None
    # Called once after JobSubmitted is published, with the driver (tests use it to act mid-job).
    on_start: Callable[[JobDriver], None] | None = None
    executor_wait_s: float = 60.0
    # Reads the fleet blocklist's changes (tailguard.agent.fleet_blocks); None: not read.
    fleet_list: Callable[[], list[FleetBlock]] | None = None
