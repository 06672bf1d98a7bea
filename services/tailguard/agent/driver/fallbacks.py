"""The decisions the agent takes itself when no service answers: one component, one code path.

Which services it stands in for is the table's word (`local_fallback` in
tailguard.system.services: the decider and the failover today). Their local cores see exactly
the events the services see (the driver feeds every event it publishes here). What they decide
is held as pending with a deadline: the service's own command, carrying the same deterministic
id, settles it; if none arrives by the deadline, the driver applies the local one and says so.
With the services off the deadline is the event's own time, so the local decision applies at
once. Speculation and blocking have no fallback: without the services a job runs as plain Spark
would, only slower on a slow node.
"""

from __future__ import annotations

from dataclasses import dataclass

from tailguard.model import records as r
from tailguard.model.config import Settings
from tailguard.system.services import SERVICES, Core, Service, local_fallbacks


@dataclass(frozen=True)
class Fallback:
    """A local decision that is due: apply it and keep the note."""

    command: r.Command
    note: str


@dataclass
class _Pending:
    command: r.Command
    deadline: int
    what: str


class LocalFallbacks:
    def __init__(
        self, settings: Settings, services: bool, table: tuple[Service, ...] = SERVICES
    ) -> None:
        self.services = services
        # (core, how long the service has to answer, the service's name), per local fallback.
        self._cores: tuple[tuple[Core, int, str], ...] = tuple(
            (s.core(settings), settings.duration_ms(s.timeout_key), s.name)
            for s in local_fallbacks(table)
        )
        self._pending: dict[str, _Pending] = {}
        self._settled: set[str] = set()

    def observe(self, event: r.Event) -> None:
        """What the local cores decide on `event` becomes pending."""
        for core, timeout, what in self._cores:
            for out in core.handle(event):
                assert isinstance(out, r.Command), f"{what} core emitted {type(out).__name__}"
                if out.id in self._settled or out.id in self._pending:
                    continue
                deadline = event.ts + (timeout if self.services else 0)
                self._pending[out.id] = _Pending(out, deadline, what)

    def settle(self, command_id: str) -> None:
        """A command with this id was handled (from a service, or applied locally)."""
        self._settled.add(command_id)
        self._pending.pop(command_id, None)

    def next_deadline(self) -> int | None:
        return min((p.deadline for p in self._pending.values()), default=None)

    def due(self, now: int) -> list[Fallback]:
        """The pending decisions whose deadline has passed, oldest first (in the order the cores
        emitted them among equal deadlines, as a service publishes them: an audit replay
        compares a service's decisions in order), now settled."""
        ready = sorted(
            (p for p in self._pending.values() if p.deadline <= now),
            key=lambda p: p.deadline,  # stable: the pending dict keeps the emission order
        )
        why = "no service answered in time" if self.services else "services off"
        out: list[Fallback] = []
        for pending in ready:
            self.settle(pending.command.id)
            kind = type(pending.command).__name__
            note = f"{pending.what}: {why}, applied local {kind} {pending.command.id}"
            out.append(Fallback(pending.command, note))
        return out
