"""The fleet blocklist's commands in a replay that lacks the other jobs' findings.

The fleet view is a function of every job's findings in their order, so a replay over all of
them (the findings topic) reproduces the fleet's `BlockNodes` exactly, and the engine compares
them like any decision. One job's archive holds only that job's findings: a block another job's
evidence caused cannot be re-derived from it. Such a log still holds what the job acted on: the
fleet command as received (its evidence ids, hosts, expiry) and the job's own events (the hosts
it had, the blocks it held, whether it applied the command). A fleet command is then *checked*
against that record instead of reproduced:

- it is exactly the command the fleet builds from what it names (`fleet_block_command`: its id
  binds one of its evidence findings, the job and the hosts; its cause names the evidence), so
  no field was altered and it names the findings behind it;
- its block held when it was sent: it ends after its `ts` and no later than one block duration
  after it (a fleet block lasts that long from its last evidence);
- if the job applied it: the hosts were the job's and the job's cap
  (`blocklist.max-blocked-fraction` of *its* hosts, with the blocks it held then) allowed it.

The job's own blocks (a cause without the fleet prefix) are a function of its own findings and
are compared exactly either way. The fleet's replayed commands are then left out: run over one
job's findings the fleet sees one job, not the fleet it decided for.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeGuard

from tailguard.blocklist.fleet import fleet_block_command
from tailguard.blocklist.policy import BlockRule
from tailguard.model import records as r
from tailguard.model.blocking import blocked_fraction_problem
from tailguard.model.config import Settings
from tailguard.model.fleet import is_fleet_cause

__all__ = ["FleetProblem", "check_fleet_commands", "evidence_in_log", "is_fleet_command"]


@dataclass(frozen=True)
class FleetProblem:
    position: int
    command: r.BlockNodes
    problem: str


def is_fleet_command(record: r.Record) -> TypeGuard[r.BlockNodes]:
    return isinstance(record, r.BlockNodes) and is_fleet_cause(record.cause)


def evidence_in_log(commands: Iterable[r.Record], finding_ids: Collection[str]) -> bool:
    """Whether every finding the fleet's commands name is in the log (then they are reproduced)."""
    return all(f in finding_ids for c in _fleet_commands(commands) for f in c.caused_by)


def _fleet_commands(records: Iterable[r.Record]) -> list[r.BlockNodes]:
    return [c for c in records if is_fleet_command(c)]


def check_fleet_commands(
    commands: Sequence[r.Record], events: Sequence[r.Event], settings: Settings
) -> list[FleetProblem]:
    """The recorded fleet commands (in `commands`) that their job's record does not bear out."""
    rule = BlockRule.from_settings(settings)
    problems: list[FleetProblem] = []
    by_job: dict[str, list[r.Event]] | None = None
    for position, command in enumerate(_fleet_commands(commands)):
        problem = _built_problem(command) or _time_problem(command, rule.duration_ms)
        if problem is None:
            if by_job is None:  # once, not a pass over every event per command
                by_job = {}
                for event in events:
                    by_job.setdefault(event.job_id, []).append(event)
            problem = _cap_problem(command, by_job.get(command.job_id, []), rule.fraction)
        if problem is not None:
            problems.append(FleetProblem(position, command, problem))
    return problems


def _built_problem(c: r.BlockNodes) -> str | None:
    if not c.caused_by:
        return "names no evidence"
    for finding_id in c.caused_by:
        built = fleet_block_command(finding_id, c.ts, c.job_id, c.hosts, c.until_ts, c.caused_by)
        if built == c:
            return None
    return "is not the command the fleet builds from the evidence it names"


def _time_problem(c: r.BlockNodes, duration_ms: int) -> str | None:
    if not 0 < c.until_ts - c.ts <= duration_ms:
        return (
            f"blocks until {c.until_ts}, not within one block duration ({duration_ms} ms) "
            f"after its ts {c.ts}"
        )
    return None


def _cap_problem(c: r.BlockNodes, job_events: Sequence[r.Event], fraction: float) -> str | None:
    """Against the job's hosts and blocks when it answered the command (None if it refused it
    or never answered: then it blocked nothing)."""
    hosts: set[str] = set()
    held: set[str] = set()
    for event in job_events:
        if isinstance(event, r.NodeAdded):
            hosts.add(event.host)
        elif isinstance(event, r.NodeRemoved):
            hosts.discard(event.host)
        elif isinstance(event, r.NodeBlocked):
            held.add(event.host)
        elif isinstance(event, r.NodeUnblocked):
            held.discard(event.host)
        elif isinstance(event, r.CommandApplied) and event.command_id == c.id:
            foreign = sorted(set(c.hosts) - hosts)
            if foreign:
                return f"applied on host(s) {foreign} the job did not have"
            return blocked_fraction_problem(held, c.hosts, hosts, fraction)
        elif isinstance(event, r.CommandRejected) and event.command_id == c.id:
            return None
    return None
