"""The test seam of a job: where a caller reaches into a running job, on the driver's thread.

Tests and the chaos cases watch its events, act once it has started, or make chosen attempts
fail for real; a plain run has no hooks. Kept apart from `RunOptions` (how a job is run), so
that what a job is run with and what a test does to it do not mix.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tailguard.model import records as r

if TYPE_CHECKING:
    from tailguard.agent.driver.driver import JobDriver


@dataclass
class JobHooks:
    # Called with each event after publishing.
    on_event: Callable[[r.Event], None] | None = None
    # Called once after the job's start is recorded, with the driver (to act mid-job).
    on_start: Callable[[JobDriver], None] | None = None
    # Attempts that fail, for real, in their executor: {(chain, subtask, attempt): message}.
    fail_attempts: dict[tuple[str, int, int], str] = field(default_factory=dict)
