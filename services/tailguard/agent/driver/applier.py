"""Applying commands: the services' (once each, from an authorised sender) and the local
fallbacks' when due, each through its handler's guard and apply (`commands.py`), answered with
`CommandApplied` or `CommandRejected`."""

from __future__ import annotations

import logging

from tailguard.agent.driver.actions import Actions
from tailguard.agent.driver.commands import handler_for
from tailguard.agent.driver.context import JobContext
from tailguard.agent.driver.fallbacks import LocalFallbacks
from tailguard.agent.driver.ports import CommandReceived
from tailguard.model import records as r
from tailguard.model.authority import authority_problem

log = logging.getLogger("tailguard.agent")


class CommandApplier:
    def __init__(self, ctx: JobContext, actions: Actions, fallbacks: LocalFallbacks) -> None:
        self._ctx = ctx
        self._actions = actions
        self.fallbacks = fallbacks
        # Command ids handled (applied or rejected after the authority check), once each.
        self.applied: set[str] = set()
        self.fallback_notes: list[str] = []
        self.rejected: list[tuple[str, str, str]] = []
        self.taken = 0

    def on_command(self, message: CommandReceived) -> None:
        command = message.command
        if command.job_id != self._ctx.job_id:
            return
        # Before the id counts as handled: decision ids are predictable, and a forged command
        # must not use up the id of the service's own, nor settle a pending fallback.
        problem = authority_problem(command, message.origin)
        if problem is not None:
            log.warning(
                "rejected %s %s: %s",
                type(command).__name__,
                command.id,
                problem,
                extra={"record_id": command.id},
            )
            self._reject(command, problem)
            return
        if command.id in self.applied:
            return  # each id at most once: a restarted service re-emits the same ids
        self.applied.add(command.id)
        self.fallbacks.settle(command.id)
        self._apply(command, fallback=False)

    def apply_due_fallbacks(self) -> None:
        for due in self.fallbacks.due(self._ctx.now()):
            if due.command.id in self.applied:
                continue
            self.applied.add(due.command.id)
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
