"""Applying commands: the services' (through the command intake, `model/command_intake.py`:
from an authorised sender, once each) and the local fallbacks' when due, each through its
handler's guard and apply (`commands.py`), answered with `CommandApplied` or `CommandRejected`."""

from __future__ import annotations

import logging

from tailguard.agent.driver.actions import Actions
from tailguard.agent.driver.commands import handler_for
from tailguard.agent.driver.context import JobContext
from tailguard.agent.driver.fallbacks import LocalFallbacks
from tailguard.agent.driver.ports import CommandReceived
from tailguard.model import records as r
from tailguard.model.command_intake import CommandIntake, Duplicate, Rejected

log = logging.getLogger("tailguard.agent")


class CommandApplier:
    def __init__(self, ctx: JobContext, actions: Actions, fallbacks: LocalFallbacks) -> None:
        self._ctx = ctx
        self._actions = actions
        self.fallbacks = fallbacks
        # Who sent each command, and the ids handled (the services' and the fallbacks'): once
        # each. The takeover restores the dead driver's.
        self.intake = CommandIntake()
        self.fallback_notes: list[str] = []
        self.rejected: list[tuple[str, str, str]] = []
        self.taken = 0

    def on_command(self, message: CommandReceived) -> None:
        command = message.command
        if command.job_id != self._ctx.job_id:
            return
        # A forgery is rejected before its id counts as handled, so it settles no pending
        # fallback either: the decider's and failover's ids are predictable.
        verdict = self.intake.take(command, message.origin)
        if isinstance(verdict, Rejected):
            log.warning(
                "rejected %s %s: %s",
                type(command).__name__,
                command.id,
                verdict.reason,
                extra={"record_id": command.id},
            )
            self._reject(command, verdict.reason)
            return
        if isinstance(verdict, Duplicate):
            return  # a restarted service re-emits the same ids
        self.fallbacks.settle(command.id)
        self._apply(command, fallback=False)

    def apply_due_fallbacks(self) -> None:
        for due in self.fallbacks.due(self._ctx.now()):
            if not self.intake.claim(due.command.id):
                continue
            self.fallback_notes.append(due.note)
            log.info(due.note, extra={"record_id": due.command.id})
            self._ctx.events.publisher.local(due.command)
            self._apply(due.command, fallback=True)

    def _apply(self, command: r.Command, fallback: bool) -> None:
        kind = type(command).__name__
        handler = handler_for(command)
        try:
            reason = (
                f"unknown command type {kind}"
                if handler is None
                else handler.guard(command, self._actions)
            )
        except Exception as err:  # a guard that trips over the command rejects it
            log.exception("checking %s %s", kind, command.id, extra={"record_id": command.id})
            reason = f"invalid command: {err!r}"
        if reason is not None or handler is None:
            self._reject(command, reason or "no handler")
            return
        # Confirm before the effects, so the archive reads cause -> effect.
        self._ctx.events.emit(r.CommandApplied, command_id=command.id, command_type=kind)
        try:
            handler.apply(command, self._actions, fallback)
        except Exception as err:
            # The guard let through a command the state could not take: say so and go on.
            log.exception("applying %s %s", kind, command.id, extra={"record_id": command.id})
            self._reject(command, f"failed while applying: {err!r}")
            return
        self.taken += 1

    def _reject(self, command: r.Command, reason: str) -> None:
        kind = type(command).__name__
        self.rejected.append((command.id, kind, reason))
        self._ctx.events.emit(
            r.CommandRejected, command_id=command.id, command_type=kind, reason=reason
        )
