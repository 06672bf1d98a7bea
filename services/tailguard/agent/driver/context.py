"""What the driver's roles share: the job, its state and its ports.

Every role (`runners`, `scheduling`, `outcomes`, `actions`, ...) works on one `JobContext`, and
only on the driver's thread, so the job's state needs no lock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tailguard.agent.driver.events import EventLog, now_ms
from tailguard.agent.driver.hooks import JobHooks
from tailguard.agent.driver.options import RunOptions
from tailguard.agent.driver.ports import Runtime
from tailguard.agent.driver.slots import SlotPool
from tailguard.agent.driver.state import Attempt, ExecutionState
from tailguard.agent.driver.storage_io import StorageWorker
from tailguard.agent.executor.sources import Split
from tailguard.agent.executor.storage import Storage
from tailguard.agent.graph.api import Job
from tailguard.agent.graph.chaining import ChainedJob
from tailguard.model import records as r
from tailguard.model.config import Settings


@dataclass
class JobContext:
    job_id: str
    job: Job
    graph: ChainedJob
    settings: Settings
    options: RunOptions
    hooks: JobHooks
    runtime: Runtime
    storage: Storage
    state: ExecutionState
    pool: SlotPool
    events: EventLog
    io: StorageWorker
    # The source vertices' input splits, found at start.
    splits: dict[str, list[Split]] = field(default_factory=dict)
    # The attempt each runner holds (deployed, not yet reported ended).
    attempt_on_slot: dict[str, Attempt] = field(default_factory=dict)
    # Set once, when the job ends.
    status: r.JobStatus | None = None

    @staticmethod
    def now() -> int:
        return now_ms()
