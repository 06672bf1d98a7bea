"""Attempt outcomes: an attempt's end decides its subtask (the first success wins, later ones
lost the race, a failure is recorded for the failover), and a sink's winner is committed.

A sink commit runs on the storage thread (`storage_io`); the winner's `AttemptFinished` is
recorded when the commit is back, so the log still reads commit -> finished (recovery relies on
it). In between the subtask has its winner, and another attempt ending then loses the race, as
it would have after a commit on this thread.
"""

from __future__ import annotations

from functools import partial

from tailguard.agent.driver import plans
from tailguard.agent.driver.context import JobContext
from tailguard.agent.driver.slots import ExecutionVertexId
from tailguard.agent.driver.state import Attempt, AttemptStatus, Subtask
from tailguard.agent.executor.attempt import AttemptOutcome
from tailguard.model import records as r


class Outcomes:
    def __init__(self, ctx: JobContext) -> None:
        self._ctx = ctx

    def attempt_ended(self, attempt: Attempt, outcome: AttemptOutcome) -> None:
        if attempt.status is not AttemptStatus.DEPLOYING:
            return
        subtask = self._ctx.state.subtask(attempt.vertex, attempt.subtask)
        assert subtask is not None
        attempt.outcome = outcome
        attempt.finished_at = self._ctx.now()
        if attempt.cancel_reason is not None:
            attempt.status = AttemptStatus.CANCELED
            self.discard_output(attempt)
            return
        if outcome.ok and subtask.winner is None:
            self._won(subtask, attempt, outcome)
        elif outcome.ok:
            # Finished after the winner but before its cancellation took effect.
            attempt.status = AttemptStatus.CANCELED
            attempt.cancel_reason = r.CancelReason.LOST_RACE.value
            self.discard_output(attempt)
            self._ctx.events.attempt_event(
                r.AttemptCanceled, attempt, reason=r.CancelReason.LOST_RACE
            )
        else:
            attempt.status = AttemptStatus.FAILED
            self._ctx.events.attempt_event(
                r.AttemptFailed,
                attempt,
                error=outcome.error or r.ErrorKind.INFRA,
                message=outcome.message,
                missing_partition=outcome.missing_partition,
                non_recoverable=outcome.non_recoverable,
            )
            if outcome.missing_partition is not None:
                self._ctx.state.mark_unavailable(outcome.missing_partition)

    def _won(self, subtask: Subtask, attempt: Attempt, outcome: AttemptOutcome) -> None:
        subtask.win(attempt)
        sink = self._ctx.state.vertices[subtask.vertex].definition.sink
        if sink is None:
            self._finished(subtask, attempt, outcome)
            return
        staged = outcome.staged
        assert staged is not None, "a sink attempt reports what it staged"
        self._ctx.io.submit(
            partial(plans.commit, self._ctx.storage, sink, staged),
            partial(self._committed, subtask, attempt, outcome),
        )

    def _committed(
        self,
        subtask: Subtask,
        attempt: Attempt,
        outcome: AttemptOutcome,
        error: BaseException | None,
    ) -> None:
        """The sink commit of `attempt` is back (`error`: why it failed)."""
        if subtask.winner is not attempt:
            # Restarted while its commit ran: its result no longer counts, as a live attempt's
            # would not (`JobActions.restart_task`); a new attempt commits over it.
            attempt.status = AttemptStatus.CANCELED
            attempt.cancel_reason = r.CancelReason.RESTART.value
            self._ctx.events.attempt_event(
                r.AttemptCanceled, attempt, reason=r.CancelReason.RESTART
            )
            return
        if error is not None:
            if not isinstance(error, OSError):
                raise error
            # The staged file is gone or changed: this attempt did not produce the output.
            subtask.unfinish()
            attempt.status = AttemptStatus.FAILED
            self._ctx.events.attempt_event(
                r.AttemptFailed,
                attempt,
                error=r.ErrorKind.INFRA,
                message=f"sink commit failed: {error}",
                missing_partition=None,
            )
            return
        subtask.committed = True
        self._finished(subtask, attempt, outcome)

    def _finished(self, subtask: Subtask, attempt: Attempt, outcome: AttemptOutcome) -> None:
        self._ctx.events.attempt_event(
            r.AttemptFinished,
            attempt,
            input_bytes=outcome.input_bytes,
            records=outcome.records,
            bytes_per_subpartition=tuple(outcome.bytes_per_subpartition),
            checksums=tuple(outcome.checksums),
        )
        for other in subtask.live_attempts():
            self.cancel(other, r.CancelReason.LOST_RACE)
        self._ctx.pool.cancel_speculative(ExecutionVertexId(subtask.vertex, subtask.index))

    def cancel(self, attempt: Attempt, reason: r.CancelReason) -> None:
        if not attempt.live:
            return
        attempt.cancel_reason = reason.value
        if attempt.slot is not None:
            self._ctx.runtime.cancel(attempt.slot, attempt.key)
        self._ctx.events.attempt_event(r.AttemptCanceled, attempt, reason=reason)

    def discard_output(self, attempt: Attempt) -> None:
        """Remove what a losing or cancelled attempt wrote, on the storage thread."""
        definition = self._ctx.state.vertices[attempt.vertex].definition
        self._ctx.io.submit(
            partial(plans.discard, self._ctx.storage, self._ctx.job_id, definition, attempt),
            _raise,
        )


def _raise(error: BaseException | None) -> None:
    """Continue a discard: an error ends the job, as it did on the driver's thread."""
    if error is not None:
        raise error
