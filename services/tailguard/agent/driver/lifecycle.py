"""The job's lifecycle: submitting it (or taking it over), waiting for the first runner before
the first placement, and ending it (its attempts cancelled, its partitions released, its sinks
finalised, `JobFinished` recorded) whatever ended it."""

from __future__ import annotations

import logging
import math
import queue
import time
from collections.abc import Callable

from tailguard.agent.driver import plans, recovery
from tailguard.agent.driver.actions import Actions
from tailguard.agent.driver.applier import CommandApplier
from tailguard.agent.driver.context import JobContext
from tailguard.agent.driver.outcomes import Outcomes
from tailguard.agent.driver.ports import InboxMessage
from tailguard.agent.driver.runners import Runners
from tailguard.agent.driver.takeover import take_over
from tailguard.agent.executor.sources import discover_splits
from tailguard.agent.fleet_blocks import apply_fleet_list
from tailguard.model import records as r
from tailguard.model.config import SERVICES_KEY, recorded_config
from tailguard.model.durations import seconds_text

log = logging.getLogger("tailguard.agent")


class Lifecycle:
    def __init__(
        self,
        ctx: JobContext,
        applier: CommandApplier,
        actions: Actions,
        outcomes: Outcomes,
        runners: Runners,
        recover: recovery.JobLog | None,
    ) -> None:
        self._ctx = ctx
        self._applier = applier
        self._actions = actions
        self._outcomes = outcomes
        self._runners = runners
        self.recover_from = recover
        self.recovered: recovery.Recovered | None = None
        self.started_ms = 0
        self.finished_ms = 0
        self.message = ""

    # ---------------------------------------------------------------- the start

    def submit(self) -> None:
        """Find the sources' splits, then record the job's submission, or take it over from
        the log of its dead driver."""
        ctx = self._ctx
        split_bytes: dict[str, tuple[int, ...]] = {}
        for name, vertex in ctx.graph.vertices.items():
            if vertex.source is not None:
                ctx.splits[name] = discover_splits(vertex.source)
                split_bytes[name] = tuple(s.bytes for s in ctx.splits[name])
        spec = ctx.graph.spec(split_bytes)
        ctx.state.broadcast_joins.sized(split_bytes)
        if self.recover_from is not None:
            self.recovered = take_over(ctx, self.recover_from, spec, self._applier)
            return
        for vertex in ctx.graph.vertices.values():
            if vertex.sink is not None:
                plans.prepare_sink(vertex.sink)
        # Whether the services run is part of the record: a replay must know which
        # decisions were made live and which only by the local fallbacks. Only policy
        # settings and markers are recorded, never connection settings or their secrets.
        config = recorded_config(
            {
                **ctx.settings.overrides(),
                SERVICES_KEY: "on" if ctx.options.services else "off",
            }
        )
        ctx.events.emit(r.JobSubmitted, name=ctx.job.name, graph=spec, config=config)

    def await_runners(
        self,
        launched: int,
        inbox: queue.Queue[InboxMessage],
        dispatch: Callable[[InboxMessage], None],
    ) -> None:
        """Wait until the first runner has connected, then take what else has arrived without
        waiting: placement starts on the hosts that have joined, and each later runner joins
        the pool when it connects. Waiting for every runner launched made the slowest host
        (a throttled node, an executor whose Python starts late) the start of the job for all.
        With `runners_min_ratio` set, placement waits for that share of them, at most
        `runners_max_wait_s` after the first (a test that needs every host at work sets 1).
        `launched` is how many runners the runtime started (0: none can connect)."""
        pool = self._ctx.pool
        options = self._ctx.options
        wait_s = options.executor_wait_s
        if not _dispatch_until(lambda: bool(pool.hosts), wait_s, inbox, dispatch):
            raise RuntimeError(
                f"no slot runner connected within {seconds_text(wait_s)} "
                f"({launched} launched, {self._runners.lost} ended before connecting; "
                "see the log)"
            )
        wanted = math.ceil(options.runners_min_ratio * launched)
        # Each runner is one slot (`Runners.on_connected`).
        enough = _dispatch_until(
            lambda: pool.total_slots() >= wanted, options.runners_max_wait_s, inbox, dispatch
        )
        if not enough:
            log.warning(
                "%d of %d slot runners connected within %s of the first "
                "(tailguard.runners.min-ratio asks %d): placing on those",
                pool.total_slots(), launched, seconds_text(options.runners_max_wait_s), wanted,
            )  # fmt: skip
        while True:
            try:
                message = inbox.get_nowait()
            except queue.Empty:
                return
            dispatch(message)

    def before_placing(self) -> None:
        """The blocks that hold before any attempt is placed: a recovered job's, then the
        fleet blocklist's (whose cap counts the recovered ones). Both reach hosts whose runners
        have not connected yet too: the pool holds a block until its host joins. The fleet
        list's cap counts every host the runtime has executors on, joined or not."""
        if self.recovered is not None:
            self._actions.restore_blocks(self.recovered.blocks)
        if self._ctx.options.fleet_list is not None:
            apply_fleet_list(self._actions, self._ctx.options.fleet_list)

    # ---------------------------------------------------------------- the end

    def succeed(self) -> None:
        ctx = self._ctx
        for vertex in ctx.state.vertices.values():
            if vertex.definition.sink is not None:
                plans.finalize_sink(ctx.storage, vertex.definition.sink)
        self.end(r.JobStatus.SUCCEEDED, "")

    def end(self, status: r.JobStatus, message: str) -> None:
        ctx = self._ctx
        if ctx.status is not None:
            return
        try:
            # Storage work in flight is finished first: a commit that landed is recorded.
            ctx.io.settle()
        except Exception:
            log.exception("finishing the storage work of job %s", ctx.job_id)
        try:
            self._clean_up()
        except Exception:  # the job's end must be recorded even if the cleanup fails
            log.exception("cleaning up job %s", ctx.job_id)
        self._actions.close_blocks()
        ctx.status = status
        # The job's own end: closing the publisher afterwards (draining late decisions into
        # the archive) is not job time.
        self.finished_ms = ctx.now()
        self.message = message
        ctx.events.emit(r.JobFinished, status=status, message=message)

    def _clean_up(self) -> None:
        ctx = self._ctx
        for attempt in ctx.state.live_attempts():
            self._outcomes.cancel(attempt, r.CancelReason.JOB_CANCELED)
        for vertex in ctx.state.vertices.values():
            if vertex.definition.sink is not None:
                continue
            for subtask in vertex.subtasks:
                if subtask.winner is not None and subtask.available:
                    subtask.available = False
                    ctx.events.emit(
                        r.PartitionReleased,
                        partition=r.PartitionRef(vertex.name, subtask.index, subtask.winner.number),
                    )
        plans.release_job(ctx.storage, ctx.job_id)

    def close(self) -> None:
        ctx = self._ctx
        try:
            ctx.io.close()
            ctx.runtime.close()
        finally:
            ctx.events.publisher.close()


def _dispatch_until(
    done: Callable[[], bool],
    wait_s: float,
    inbox: queue.Queue[InboxMessage],
    dispatch: Callable[[InboxMessage], None],
) -> bool:
    """Dispatch the inbox's messages as they arrive until `done()`; False if `wait_s` passed
    first."""
    deadline = time.monotonic() + wait_s
    while not done():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        try:
            dispatch(inbox.get(timeout=left))
        except queue.Empty:
            continue
    return True
