"""The one way in for the services' commands, for both actuators (docs/architecture.md).

The owned driver (`agent/driver/applier.py`) and attach mode (`observer/actuation.py`) each hold a
`CommandIntake` on the one thread that applies their commands, and hand it every command they
received with what its signature said (the `Origin` the adapter's verifier found). The intake
answers with a verdict, and only an `Admitted` command goes on to the actuator's guards:

1. **Where it came from** (`authority_problem`): an unauthentic signature, or a signer that may
   not send this kind of command under this id, is `Rejected` with the reason the actuator
   publishes in its `CommandRejected`.
2. **Each id at most once**: a restarted service re-emits the same ids; a command whose id was
   handled before is a `Duplicate`, and nothing answers it. This comes after the first check:
   decision ids are predictable, and a forgery must not use up the id of the service's own
   decision (nor, in the driver, settle the fallback waiting for it).

An admitted id counts as handled whatever the guards then say (a guard's rejection is answered
once, as the application is then; a replay expects no second answer).

The module is pure: standard library and records only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tailguard.model import records as r
from tailguard.model.authority import Origin, authority_problem


@dataclass(frozen=True, slots=True)
class Admitted:
    """The command may go to the actuator's guards; its id is now handled."""


@dataclass(frozen=True, slots=True)
class Rejected:
    """Not a decision the actuator may take from its sender: answer `CommandRejected(reason)`.
    The id is not used up."""

    reason: str


@dataclass(frozen=True, slots=True)
class Duplicate:
    """The id was handled before: nothing to do, nothing to answer."""


Verdict = Admitted | Rejected | Duplicate


class CommandIntake:
    """Who sent a command, then whether its id is new: one actuator's record of the ids it has
    handled. Not thread-safe: the actuator's applying thread owns it."""

    def __init__(self, handled: Iterable[str] = ()) -> None:
        self._handled: set[str] = set(handled)

    def take(self, command: r.Command, origin: Origin) -> Verdict:
        """The verdict on a received `command` that `origin` says came from where it did."""
        problem = authority_problem(command, origin)
        if problem is not None:
            return Rejected(problem)
        return Admitted() if self.claim(command.id) else Duplicate()

    def claim(self, command_id: str) -> bool:
        """Take `command_id` for a decision about to be applied (a received command admitted,
        or the agent's own fallback decision); False if it was handled already."""
        if command_id in self._handled:
            return False
        self._handled.add(command_id)
        return True

    def restore(self, handled: Iterable[str]) -> None:
        """The ids a previous actuator of the job handled (a recovered job's log): each stays
        handled, so none is applied twice across the takeover."""
        self._handled.update(handled)
