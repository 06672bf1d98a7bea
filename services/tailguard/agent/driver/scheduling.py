"""Scheduling and placement: which subtasks need an attempt, in which order they ask for slots,
and deploying attempts (one, or a pipelined region's bulk) to the slots the pool assigns."""

from __future__ import annotations

import logging

from tailguard.agent.driver import plans
from tailguard.agent.driver.context import JobContext
from tailguard.agent.driver.ordering import order_requests, subtask_order
from tailguard.agent.driver.runners import Runners
from tailguard.agent.driver.slots import (
    ExecutionVertexId,
    RegionRequest,
    Slot,
    SlotRequest,
    SpeculativeRequest,
)
from tailguard.agent.driver.state import Attempt, Subtask, slot_requests
from tailguard.model import records as r

log = logging.getLogger("tailguard.agent")


class Scheduler:
    def __init__(self, ctx: JobContext, runners: Runners) -> None:
        self._ctx = ctx
        self._runners = runners
        self._batch_rows = plans.batch_rows(ctx.settings)
        self._subtask_order = subtask_order(ctx.settings)

    def schedule(self) -> None:
        ctx = self._ctx
        queued = ctx.pool.queued_keys()
        fresh = order_requests(
            slot_requests(ctx.state, queued),
            lambda task: plans.subtask_input_bytes(ctx.state, task, ctx.splits),
            self._subtask_order,
        )
        for request in fresh:
            if len(request.tasks) > 1 and not ctx.pool.could_ever_place(request):
                # FLIP-119 needs the largest region to fit; it waits in case executors join.
                log.warning(
                    "pipelined region %s needs %d slots, the cluster has %d: it waits for more",
                    request.key,
                    len(request.tasks),
                    ctx.pool.total_slots(),
                )
            ctx.pool.request(request)
        # A request made stale while it waited (a restart, a winner, an input being
        # re-produced) is dropped without a slot; a fresh request follows when it is due.
        for request, placed in ctx.pool.assign(ctx.now(), self._still_wanted):
            if isinstance(request.key, RegionRequest):
                self._deploy_region(request, placed)
                continue
            task, slot = next(iter(placed.items()))
            subtask = ctx.state.subtask(*task)
            assert subtask is not None, f"a request for unknown task {task}"
            if isinstance(request.key, SpeculativeRequest):
                self._deploy(subtask, slot, True, request.key.command_id)
            else:
                subtask.wanted = False
                self._deploy(subtask, slot, False, None)

    def _still_wanted(self, request: SlotRequest) -> bool:
        state = self._ctx.state
        if isinstance(request.key, RegionRequest):
            region = state.region_of(*request.tasks[0])
            return region is not None and state.bulk_ready(region) == tuple(request.tasks)
        subtask = state.subtask(*request.tasks[0])
        if subtask is None:
            return False
        if isinstance(request.key, SpeculativeRequest):
            return (
                subtask.winner is None
                and bool(subtask.live_attempts())
                and state.inputs_available(subtask)
            )
        return state.deployable(subtask)

    def _deploy_region(self, request: SlotRequest, placed: dict[ExecutionVertexId, Slot]) -> None:
        """Deploy a pipelined region's bulk at once, producers first (the request lists them in
        topological order), each consumer naming the producer attempts deployed with it."""
        state = self._ctx.state
        tasks = tuple(request.tasks)
        region = state.region_of(*tasks[0])
        if region is None or state.bulk_ready(region) != tasks:
            # The region changed while queued (a restart, a finished task): ask again.
            for slot in placed.values():
                self._ctx.pool.release(slot.slot_id)
            return
        together: dict[ExecutionVertexId, int] = {}
        for subtask in state.subtasks_of(tasks):
            subtask.wanted = False
            task = ExecutionVertexId(subtask.vertex, subtask.index)
            together[task] = self._deploy(subtask, placed[task], False, None, together)

    def _deploy(
        self,
        subtask: Subtask,
        slot: Slot,
        speculative: bool,
        command_id: str | None,
        together: dict[ExecutionVertexId, int] | None = None,
    ) -> int:
        """Deploy a new attempt of `subtask` to `slot`; returns its number."""
        ctx = self._ctx
        number = subtask.next_number()
        spec = plans.task_spec(
            ctx.state,
            ctx.job_id,
            ctx.storage,
            subtask,
            number,
            ctx.splits,
            ctx.hooks.fail_attempts.get((subtask.vertex, subtask.index, number)),
            together,
            self._batch_rows,
        )
        attempt = Attempt(
            vertex=subtask.vertex,
            subtask=subtask.index,
            number=number,
            host=slot.host,
            speculative=speculative,
            command_id=command_id,
            deployed_at=ctx.now(),
            slot=slot.slot_id,
        )
        subtask.attempts.append(attempt)
        ctx.events.attempt_event(
            r.AttemptDeploying, attempt, speculative=speculative, command_id=command_id
        )
        self._runners.deployed(attempt, slot.slot_id)
        ctx.runtime.deploy(slot.slot_id, spec)
        return number
