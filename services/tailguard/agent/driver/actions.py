"""The command actions: what an applied command may read and do to the job (`JobView`,
`JobActions` in `commands.py`), each action recording its own events; and the record of the
hosts blocked during the job, for its result."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tailguard.agent.driver.context import JobContext
from tailguard.agent.driver.initialization import VertexInitializer
from tailguard.agent.driver.outcomes import Outcomes
from tailguard.agent.driver.slots import (
    ExecutionVertexId,
    SlotPool,
    SlotRequest,
    SpeculativeRequest,
)
from tailguard.agent.driver.state import ExecutionState
from tailguard.model import records as r
from tailguard.model.config import Settings


class Actions:
    """Implements `JobActions` (and so `JobView`, and the fleet list's `StartingJob`)."""

    def __init__(
        self,
        ctx: JobContext,
        initializer: VertexInitializer,
        outcomes: Outcomes,
        end: Callable[[r.JobStatus, str], None],
    ) -> None:
        self._ctx = ctx
        self._initializer = initializer
        self._outcomes = outcomes
        self._end = end
        self.job_id = ctx.job_id
        self.settings: Settings = ctx.settings
        self._max_concurrent = ctx.settings.integer(
            "execution.batch.speculative.max-concurrent-executions"
        )
        self._max_blocked_fraction = ctx.settings.number("blocklist.max-blocked-fraction")
        # Hosts blocked and lifted: (host, from ms, until ms); and when each blocked one was.
        self.blocks: list[tuple[str, int, int]] = []
        self._block_started: dict[str, int] = {}

    # ---------------------------------------------------------------- JobView

    @property
    def state(self) -> ExecutionState:
        return self._ctx.state

    @property
    def pool(self) -> SlotPool:
        return self._ctx.pool

    @property
    def hosts(self) -> frozenset[str]:
        return frozenset({*self._ctx.pool.hosts, *self._ctx.runtime.executors()})

    @property
    def split_counts(self) -> Mapping[str, int]:
        return {name: len(splits) for name, splits in self._ctx.splits.items()}

    @property
    def max_concurrent(self) -> int:
        return self._max_concurrent

    @property
    def max_blocked_fraction(self) -> float:
        return self._max_blocked_fraction

    def now(self) -> int:
        return self._ctx.now()

    # ---------------------------------------------------------------- JobActions

    def initialize_vertex(
        self,
        name: str,
        parallelism: int,
        inputs: tuple[r.SubtaskInputs, ...],
        by: str,
        command_id: str,
    ) -> None:
        self._initializer.initialize(name, parallelism, inputs, by, command_id)

    def request_speculative(
        self, task: ExecutionVertexId, command_id: str, count: int, avoid: frozenset[str]
    ) -> None:
        for n in range(count):
            self._ctx.pool.request(
                SlotRequest(
                    key=SpeculativeRequest(task, command_id, n),
                    tasks=[task],
                    avoid={task: avoid},
                )
            )

    def block_host(self, host: str, until_ts: int, cause: str, command_id: str) -> None:
        self._block_started.setdefault(host, self.now())
        self._ctx.pool.block(host, until_ts)
        self._ctx.events.emit(
            r.NodeBlocked, host=host, until_ts=until_ts, cause=cause, command_id=command_id
        )

    def unblock_host(self, host: str, command_id: str | None) -> None:
        now = self.now()
        self._ctx.pool.unblock(host)
        self.blocks.append((host, self._block_started.pop(host, now), now))
        self._ctx.events.emit(r.NodeUnblocked, host=host, command_id=command_id)

    def restart_task(self, task: ExecutionVertexId, not_before_ts: int) -> None:
        subtask = self._ctx.state.subtask(*task)
        assert subtask is not None, f"restart of unknown task {task}"
        for attempt in subtask.live_attempts():
            self._outcomes.cancel(attempt, r.CancelReason.RESTART)
        subtask.unfinish()
        subtask.not_before = not_before_ts
        # Queued requests were made against the old state: drop them, fresh ones follow.
        self._ctx.pool.cancel_speculative(task)

    def fail_job(self, reason: str) -> None:
        self._end(r.JobStatus.FAILED, reason)

    # ---------------------------------------------------------------- the blocks' record

    def restore_blocks(self, blocks: Mapping[str, int]) -> None:
        """A recovered job's blocks (host -> until ms): still blocked for the services; one
        whose time is up is lifted at the tick."""
        now = self.now()
        for host, until in sorted(blocks.items()):
            self._block_started[host] = now
            self._ctx.pool.block(host, until)

    def lift_expired(self) -> None:
        for host in self._ctx.pool.expired_blocks(self.now()):
            self.unblock_host(host, None)

    def close_blocks(self) -> None:
        """At the job's end: the hosts still blocked were blocked until now."""
        for host in self._ctx.pool.blocked():
            self.blocks.append((host, self._block_started.pop(host, self.now()), self.now()))
