"""The relay's side of attach mode: the services' commands in, actions to the JVM, outcomes out.

The relay (`observer/relay.py`) runs this on its one thread, between Spark's events, so the
translator's picture of the application and the commands' outcomes stay in one order:

1. `received`: a command from Kafka, with what its signature said. Through the command intake
   the owned driver uses too (`model.command_intake`: signature and who may send what, then each
   id at most once, so a forgery cannot use up a real decision's id), then by its guard
   (`observer.command_guards`). A rejection is answered with `CommandRejected` at once; an action is
   written to the JVM actuator, one line.
2. `outcome`: the actuator's answer (`CO id OK` / `CO id NO reason`) becomes `CommandApplied`
   (with its effects: `NodeBlocked` in every running job, since Spark's exclusion list is the
   application's) or `CommandRejected`.
3. `job_started` and `tick`: a job that starts under a block is told so, and a block that has
   run out is lifted in the events as Spark lifts it in its scheduler.
4. `fleet`: the cluster-wide blocklist (`tailguard.blocklist`), read when the relay starts and
   again every `FLEET_REFRESH_S`, and applied to each host of the application as it joins
   (the per-application cap, `blocklist.max-blocked-fraction`, as a job applies it).

The JVM says at start which command kinds this Spark build cannot apply (`available`); those are
rejected here with its reason, after one warning each.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import IO

from tailguard.agent.fleet_blocks import blocks_to_apply
from tailguard.model import records as r
from tailguard.model.authority import Origin
from tailguard.model.command_intake import CommandIntake, Duplicate, Rejected
from tailguard.model.config import Settings, parse_duration_ms
from tailguard.model.fleet import FLEET_SETTING, FleetBlock
from tailguard.observer import command_guards as ac
from tailguard.observer.query_plans import PlanRequest
from tailguard.observer.translate import RunningTask, SparkEventTranslator
from tailguard.system.services import issuer_of

log = logging.getLogger("tailguard.attach")

# How long the query-stage rule waits for the decider's ranges before Spark's own stand
# (docs/attach.md#setparallelism says why 2 s).
DECISION_TIMEOUT_KEY = "tailguard.attach.decision-timeout"
DECISION_TIMEOUT = "2 s"

# How often the relay reads the fleet list again: a host listed while the application runs is
# blocked in it within this time.
FLEET_REFRESH_S = 10.0
# The id of the action that applies a fleet entry (not a command: nothing answers it on the
# topics; its NodeBlocked events name the entry's id).
_FLEET_ACTION = "fleet:"

# The commands each actuator kind serves (the JVM names kinds by the command they apply).
_KIND = {
    r.LaunchSpeculativeAttempts: "LaunchSpeculativeAttempts",
    r.BlockNodes: "BlockNodes",
    r.UnblockNodes: "BlockNodes",
    r.RestartTasks: "RestartTasks",
    r.FailJob: "FailJob",
    r.SetParallelism: "SetParallelism",
}


@dataclass(frozen=True)
class _Block:
    until_ts: int
    cause: str
    command_id: str


@dataclass(frozen=True)
class _Pending:
    command: r.Command | None  # None: a fleet entry
    action: ac.SparkAction
    entry_id: str = ""
    sent: float = 0.0  # time.monotonic() when the action went to the JVM


class Actuation(ac.AppView):
    """One attached application's command intake and the blocks in force in it."""

    def __init__(
        self, translator: SparkEventTranslator, settings: Settings, channel: IO[bytes]
    ) -> None:
        self._translator = translator
        self._channel = channel
        self._max_fraction = settings.number("blocklist.max-blocked-fraction")
        self._fleet = settings.flag(FLEET_SETTING)
        # Parsed here, with the project's one duration parser; the JVM gets milliseconds.
        self._decision_timeout_ms = parse_duration_ms(
            settings.get(DECISION_TIMEOUT_KEY) or DECISION_TIMEOUT
        )
        self._blocks: dict[str, _Block] = {}
        self._intake = CommandIntake()
        self._pending: dict[str, _Pending] = {}
        self._unavailable: dict[str, str] = {}
        self._probed = False
        self._fleet_changes: list[FleetBlock] = []
        # Milliseconds from a command reaching the relay to the JVM's answer, per command
        # answered by the JVM (what `make bench-attach` reports).
        self.outcome_ms: list[float] = []
        self.applied = 0
        self.rejected = 0

    # ------------------------------------------------------------------ AppView

    @property
    def hosts(self) -> Collection[str]:
        return self._translator.hosts

    @property
    def blocked(self) -> Collection[str]:
        return self._blocks.keys()

    @property
    def max_blocked_fraction(self) -> float:
        return self._max_fraction

    @property
    def fleet_enabled(self) -> bool:
        return self._fleet

    def running_job(self, job_id: str) -> int | None:
        return self._translator.running_job(job_id)

    def subtask_problem(self, job_id: str, vertex: str, subtask: int) -> str | None:
        return self._translator.subtask_problem(job_id, vertex, subtask)

    def running_tasks(self, job_id: str, vertex: str, subtask: int) -> Sequence[RunningTask]:
        return self._translator.running_tasks(job_id, vertex, subtask)

    def plan_request(self, job_id: str) -> PlanRequest | None:
        return self._translator.plan_request(job_id)

    # ------------------------------------------------------------------ the JVM

    def probe(self) -> None:
        """Ask the actuator which command kinds this Spark build lacks (answered by `AV`), and
        tell it how long a query stage waits for the decider's ranges (`PROBE ms`)."""
        self._write(f"PROBE\t{self._decision_timeout_ms}\n")

    def available(self, fields: Sequence[str]) -> None:
        """An `AV kind reason` line; the empty kind ends the list."""
        kind, reason = (fields[1], fields[2]) if len(fields) >= 3 else ("", "")
        if not kind:
            self._probed = True
            kinds = sorted(set(_KIND.values()) - set(self._unavailable))
            log.info("attach: the actuator applies %s", ", ".join(kinds) or "nothing")
            return
        self._unavailable[kind] = reason
        # Whose decisions go unapplied, from the table of the services: what a person turns to.
        issuer = issuer_of(r.RECORD_TYPES_BY_NAME[kind]) if kind in r.RECORD_TYPES_BY_NAME else ""
        lost = f" ({issuer}'s decisions are rejected)" if issuer else ""
        log.warning("attach: %s commands are off%s: %s", kind, lost, reason)

    def _write(self, line: str) -> None:
        self._channel.write(line.encode())
        self._channel.flush()

    # ------------------------------------------------------------------ commands

    def received(self, command: r.Command, origin: Origin, now: int) -> list[r.Event]:
        """Events answering `command` now (a rejection), or none while the JVM applies it."""
        arrived = time.monotonic()
        verdict = self._intake.take(command, origin)
        if isinstance(verdict, Rejected):
            log.warning(
                "attach: rejected %s %s: %s", type(command).__name__, command.id, verdict.reason
            )
            return self._rejected(command, verdict.reason, now)
        if isinstance(verdict, Duplicate):
            return []  # a restarted service re-emits the same ids
        kind = _KIND.get(type(command))
        if kind is not None and kind in self._unavailable:
            return self._rejected(command, self._unavailable[kind], now)
        try:
            action = ac.action_for(command, self)
        except Exception as err:  # a guard that trips over the command rejects it
            log.exception("attach: checking %s %s", type(command).__name__, command.id)
            action = f"invalid command: {err!r}"
        if isinstance(action, str):
            return self._rejected(command, action, now)
        if isinstance(action, ac.NoAction):
            log.info("attach: %s %s: %s", type(command).__name__, command.id, action.why)
            return self._applied_events(command, action, now)
        self._pending[command.id] = _Pending(command, action, sent=arrived)
        self._write(ac.action_line(command.id, action))
        return []

    def outcome(self, fields: Sequence[str], now: int) -> list[r.Event]:
        """A `CO id OK` or `CO id NO reason` line from the actuator."""
        pending = self._pending.pop(fields[1], None) if len(fields) >= 3 else None
        if pending is None:
            log.error("attach: an outcome for no pending command: %r", list(fields))
            return []
        if pending.command is None:
            return self._fleet_outcome(pending, fields, now)
        self.outcome_ms.append((time.monotonic() - pending.sent) * 1000)
        if fields[2] == "OK":
            return self._applied_events(pending.command, pending.action, now)
        reason = fields[3] if len(fields) > 3 else "refused by Spark"
        return self._rejected(pending.command, reason, now)

    def _rejected(self, command: r.Command, reason: str, now: int) -> list[r.Event]:
        self.rejected += 1
        event = self._translator.job_event(
            command.job_id,
            r.CommandRejected,
            now,
            command_id=command.id,
            command_type=type(command).__name__,
            reason=reason,
        )
        return [event] if event is not None else []

    def _applied_events(
        self, command: r.Command, action: ac.SparkAction, now: int
    ) -> list[r.Event]:
        self.applied += 1
        out: list[r.Event] = []
        confirmed = self._translator.job_event(
            command.job_id,
            r.CommandApplied,
            now,
            command_id=command.id,
            command_type=type(command).__name__,
        )
        if confirmed is not None:
            out.append(confirmed)
        if isinstance(action, ac.Exclude):
            for host in action.hosts:
                self._blocks[host] = _Block(action.until_ts, action.cause, command.id)
                out += self._to_running_jobs(now, host, self._blocks[host])
        elif isinstance(action, ac.Include):
            for host in action.hosts:
                if self._blocks.pop(host, None) is not None:
                    out += self._to_running_jobs(now, host, None, command.id)
        return out

    # ------------------------------------------------------------------ the fleet list

    def fleet(self, changes: list[FleetBlock] | None, now: int) -> None:
        """Apply the fleet list's blocks in force on the application's hosts (`changes`: the
        list as just read; None: as last read, for a host that has just joined)."""
        if changes is not None:
            self._fleet_changes = changes
        if not self._fleet or "BlockNodes" in self._unavailable:
            return
        held = set(self._blocks) | {
            h
            for p in self._pending.values()
            if isinstance(p.action, ac.Exclude)
            for h in p.action.hosts
        }
        for entry in blocks_to_apply(
            self._fleet_changes, self.hosts, held, self._max_fraction, now
        ):
            if entry.host in held or entry.until_ts is None:
                continue
            action = ac.Exclude((entry.host,), entry.until_ts, entry.fleet_cause())
            action_id = f"{_FLEET_ACTION}{entry.id}:{entry.host}"
            self._pending[action_id] = _Pending(None, action, entry.id)
            self._write(ac.action_line(action_id, action))
            held.add(entry.host)

    def _fleet_outcome(self, pending: _Pending, fields: Sequence[str], now: int) -> list[r.Event]:
        assert isinstance(pending.action, ac.Exclude)
        if fields[2] != "OK":
            reason = fields[3] if len(fields) > 3 else "refused by Spark"
            log.warning("attach: fleet block on %s not applied: %s", pending.action.hosts, reason)
            return []
        out: list[r.Event] = []
        for host in pending.action.hosts:
            log.info("attach: %s blocked from the fleet list (%s)", host, pending.entry_id)
            block = _Block(pending.action.until_ts, pending.action.cause, pending.entry_id)
            self._blocks[host] = block
            out += self._to_running_jobs(now, host, block)
        return out

    # ------------------------------------------------------------------ blocks over time

    def job_started(self, job_id: str, ts: int) -> list[r.Event]:
        """The blocks in force, for a job that has just been submitted."""
        events = (self._block_event(job_id, ts, h, b) for h, b in self._blocks.items())
        return [e for e in events if e is not None]

    def _block_event(self, job_id: str, ts: int, host: str, block: _Block) -> r.Event | None:
        return self._translator.job_event(
            job_id,
            r.NodeBlocked,
            ts,
            host=host,
            until_ts=block.until_ts,
            cause=block.cause,
            command_id=block.command_id,
        )

    def tick(self, now: int) -> list[r.Event]:
        """Blocks whose time is up: Spark lifts them at its next offer; so do the events."""
        out: list[r.Event] = []
        for host in [h for h, b in self._blocks.items() if b.until_ts <= now]:
            del self._blocks[host]
            out += self._to_running_jobs(now, host, None, None)
        return out

    def _to_running_jobs(
        self,
        ts: int,
        host: str,
        block: _Block | None,
        command_id: str | None = None,
    ) -> list[r.Event]:
        """`NodeBlocked` (with `block`) or `NodeUnblocked` in every running job."""
        out: list[r.Event] = []
        for job_id in self._translator.running_jobs:
            if block is not None:
                event = self._block_event(job_id, ts, host, block)
            else:
                event = self._translator.job_event(
                    job_id, r.NodeUnblocked, ts, host=host, command_id=command_id
                )
            if event is not None:
                out.append(event)
        return out
