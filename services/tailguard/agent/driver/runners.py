"""Runner messages: slot runners joining and leaving the pool, and their reports about the
attempts they run (started, progress, ended), with the dispatch timings taken from them."""

from __future__ import annotations

import time
from dataclasses import dataclass

from tailguard.agent.driver.context import JobContext
from tailguard.agent.driver.outcomes import Outcomes
from tailguard.agent.driver.ports import FromRunner, RunnerConnected, RunnerLost
from tailguard.agent.driver.state import Attempt
from tailguard.agent.executor.attempt import AttemptOutcome
from tailguard.agent.executor.protocol import AttemptEnded, AttemptProgressed, AttemptStarted
from tailguard.model import records as r


@dataclass
class _Dispatch:
    """Driver-side timings of one attempt, for the dispatch overhead."""

    sent: float
    running: float | None = None


class Runners:
    def __init__(self, ctx: JobContext, outcomes: Outcomes) -> None:
        self._ctx = ctx
        self._outcomes = outcomes
        self._dispatch: dict[tuple[str, int, int], _Dispatch] = {}
        self.dispatch_ms: list[float] = []
        self.deploy_to_running_ms: list[float] = []
        self.lost = 0

    def deployed(self, attempt: Attempt, slot: str) -> None:
        """`attempt` is being sent to the runner of `slot`."""
        self._ctx.attempt_on_slot[slot] = attempt
        self._dispatch[(attempt.vertex, attempt.subtask, attempt.number)] = _Dispatch(
            time.perf_counter()
        )

    def on_connected(self, message: RunnerConnected) -> None:
        if self._ctx.pool.add_slot(message.host, message.slot):
            self._ctx.events.emit(r.NodeAdded, host=message.host, slots=message.host_slots)

    def on_lost(self, message: RunnerLost) -> None:
        ctx = self._ctx
        self.lost += 1
        attempt = ctx.attempt_on_slot.pop(message.slot, None)
        host, host_gone = ctx.pool.remove_slot(message.slot)
        if attempt is not None:
            attempt.slot = None
            self._outcomes.attempt_ended(
                attempt,
                AttemptOutcome(
                    ok=False,
                    host=attempt.host,
                    started_at_ms=attempt.deployed_at,
                    finished_at_ms=ctx.now(),
                    error=r.ErrorKind.NODE_LOST,
                    message=f"slot runner {message.slot} lost: {message.reason}",
                ),
            )
        if host is not None and host_gone:
            ctx.events.emit(r.NodeRemoved, host=host, reason=message.reason)
        if host is not None and ctx.status is None:
            # A runner that ended with its executor still there (a cancelled attempt that
            # ignored the flag, a crashed worker process) is replaced at once.
            ctx.runtime.ensure_runners()

    def on_report(self, message: FromRunner) -> None:
        report = message.message
        attempt = self._ctx.attempt_on_slot.get(message.slot)
        if attempt is None or attempt.key != report.key:
            return  # about an attempt this slot no longer holds (it was lost and replaced)
        timing = self._dispatch.get((attempt.vertex, attempt.subtask, attempt.number))
        if isinstance(report, AttemptStarted):
            if timing is not None and timing.running is None:
                timing.running = message.received
                self.deploy_to_running_ms.append((message.received - timing.sent) * 1000.0)
        elif isinstance(report, AttemptProgressed):
            if attempt.live:
                self._ctx.events.attempt_event(
                    r.AttemptProgress,
                    attempt,
                    records_read=report.records_read,
                    bytes_read=report.bytes_read,
                    bytes_total=report.bytes_total,
                )
        elif isinstance(report, AttemptEnded):
            if timing is not None:
                round_trip = (message.received - timing.sent) * 1000.0
                self.dispatch_ms.append(max(0.0, round_trip - report.run_ms))
            del self._ctx.attempt_on_slot[message.slot]
            self._ctx.pool.release(message.slot)
            attempt.slot = None
            self._outcomes.attempt_ended(attempt, report.outcome)
