"""Who may command a job: where a received command came from, and what each signer may ask.

The agent takes a command only from the service whose job it is to decide it (the table
`PERMITTED`). Whether a command came from that service is what its signature says (see
`tailguard.kafka.signing`): the adapter that receives the command checks the signature and hands
the driver an `Origin`; `authority_problem` turns an origin into the reason a command is
rejected, or None.

The agent's own fallback decisions (the local decider and failover cores) are signed as `AGENT`
and carry the ids those services would have used, so the table allows the agent exactly what it
stands in for.

A rejection for authority starts with one of two fixed prefixes, so a replay can tell a command
that was never a service decision from one a service made and the job could not take.

The module is pure: standard library and records only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tailguard.model import records as r
from tailguard.model.fleet import BLOCKLIST_TOPIC

# The signer name of the agent's own (fallback) commands; services sign with their names.
AGENT = "agent"

PERMITTED: Mapping[str, frozenset[type[r.Command]]] = {
    "speculator": frozenset({r.LaunchSpeculativeAttempts}),
    "blocklist": frozenset({r.BlockNodes, r.UnblockNodes}),
    "decider": frozenset({r.SetParallelism}),
    "failover": frozenset({r.RestartTasks, r.FailJob}),
}
# An operator draining a host (`tailguard blocklist add|remove`) signs as this; it commands no
# job directly, it writes the fleet list, which jobs read when they start.
OPERATOR = "operator"
# Who may write `tailguard.blocklist` (the fleet list): the blocklist service and operators.
FLEET_WRITERS = frozenset({"blocklist", OPERATOR})
# The services whose decisions the agent takes itself when they do not answer.
AGENT_STANDS_IN_FOR = frozenset({"decider", "failover"})
# Who may write what the services and the fleet list's readers read: a job's facts come from
# its agent (or the observer's relay, which publishes as the agent does), findings from the
# detector, the fleet list from its writers. With signing on, a service feeds its core nothing
# else: a forged fact would steer its decisions as surely as a forged command steers the job (a
# fake slow attempt gets a healthy host blocked).
INPUT_WRITERS: Mapping[str, frozenset[str]] = {
    r.EVENTS_TOPIC: frozenset({AGENT}),
    r.FINDINGS_TOPIC: frozenset({"detector"}),
    BLOCKLIST_TOPIC: FLEET_WRITERS,
}

# CommandRejected.reason starts with one of these when the command was not a service decision.
UNAUTHENTICATED = "unauthenticated: "
NOT_PERMITTED = "not permitted: "

# The archive's topic for commands whose signature did not check out: received and kept for the
# audit, but not on the commands a replay compares with the services' decisions.
UNAUTHENTICATED_COMMANDS_TOPIC = r.COMMANDS_TOPIC + ".unauthenticated"
# The same for findings the agent received that their topic's writer did not sign: the services
# refuse them (`input_problem`), so a replay must not feed them to the speculator and blocklist.
UNAUTHENTICATED_FINDINGS_TOPIC = r.FINDINGS_TOPIC + ".unauthenticated"

# Signer names and key ids come from message headers anyone can write: what a reason repeats of
# them is cut to this length.
_SHOWN = 40


@dataclass(frozen=True, slots=True)
class Signed:
    """The signature checked out: `signer` holds the key named `key_id`."""

    signer: str
    key_id: str


@dataclass(frozen=True, slots=True)
class Unauthentic:
    """Signing is on and the signature is missing or wrong (`reason` says which)."""

    reason: str


@dataclass(frozen=True, slots=True)
class Unchecked:
    """Signing is off (no key configured): nothing tells who sent the command."""


Origin = Signed | Unauthentic | Unchecked


def shown(text: str) -> str:
    """`text` from a header, quoted and cut short for a reason or a log line."""
    cut = text if len(text) <= _SHOWN else text[:_SHOWN] + "…"
    return repr(cut)


def issuer_named_by(command_id: str) -> str:
    """The service a decision id names (`derived_id` puts it first: `<service>-<digest>`)."""
    return command_id.split("-", 1)[0]


def permission_problem(signer: str, command: r.Command) -> str | None:
    """Why `signer` may not issue `command`, or None if it may.

    A service may issue only its own kinds of command, under ids that name it (so a replay
    attributes every command to the service that really sent it); the agent, only the kinds of
    the services it stands in for, under their ids.
    """
    kind = type(command).__name__
    named = issuer_named_by(command.id)
    if signer == AGENT:
        if named not in AGENT_STANDS_IN_FOR:
            return (
                f"the agent signs only the decisions it takes for "
                f"{' and '.join(sorted(AGENT_STANDS_IN_FOR))}, not an id naming {shown(named)}"
            )
        issuer = named
    elif signer not in PERMITTED:
        return f"{shown(signer)} issues no commands"
    elif named != signer:
        return f"signed by {signer} but its id names {shown(named)}"
    else:
        issuer = signer
    if type(command) not in PERMITTED[issuer]:
        allowed = sorted(s for s, kinds in PERMITTED.items() if type(command) in kinds)
        return f"{kind} is accepted only from {' or '.join(allowed) or 'nobody'}, not {signer}"
    return None


def authority_problem(command: r.Command, origin: Origin) -> str | None:
    """The reason to reject `command` for where it came from, or None to go on with it."""
    if isinstance(origin, Unchecked):
        return None  # signing is off: every command is taken, as before signing existed
    if isinstance(origin, Unauthentic):
        return UNAUTHENTICATED + origin.reason
    problem = permission_problem(origin.signer, command)
    return None if problem is None else NOT_PERMITTED + problem


def input_problem(topic: str, origin: Origin) -> str | None:
    """Why a reader must not take a record it read on `topic`, or None to take it."""
    if isinstance(origin, Unchecked):
        return None  # signing is off: every record is taken, as before signing existed
    if isinstance(origin, Unauthentic):
        return UNAUTHENTICATED + origin.reason
    writers = INPUT_WRITERS.get(topic, frozenset())
    if origin.signer not in writers:
        return (
            f"{NOT_PERMITTED}{topic} is written by {' or '.join(sorted(writers)) or 'nobody'}, "
            f"not {shown(origin.signer)}"
        )
    return None


def received_archive_topic(record: r.Record, topic: str, origin: Origin) -> str | None:
    """Where an agent archives a command or finding it received: under its own topic (None), or
    apart, where a replay does not take it for a service's output. A command signed by the wrong
    service stays on its topic: the agent answers it with `CommandRejected`, which the replay
    reads; a finding has no answer, so any finding the services would refuse is kept apart.
    A service's announcement of its settings goes with its outputs: a replay takes the settings
    only from one that checks out."""
    if isinstance(record, r.Command | r.CommandSettings):
        return UNAUTHENTICATED_COMMANDS_TOPIC if isinstance(origin, Unauthentic) else None
    finding = isinstance(record, r.Finding | r.FindingSettings)
    if finding and input_problem(topic, origin) is not None:
        return UNAUTHENTICATED_FINDINGS_TOPIC
    return None


def is_authority_rejection(rejected: r.CommandRejected) -> bool:
    """Whether the agent rejected the command for where it came from (not for what it asked)."""
    return rejected.reason.startswith((UNAUTHENTICATED, NOT_PERMITTED))
