"""Re-running the decision cores over a recorded log, and comparing what they emit.

Each service reads exactly one topic, so its decisions are a function of that topic's order. An
audit replay therefore feeds every core the input it saw live — the recorded events for the
detector, decider and failover, the recorded findings for the speculator and blocklist — and
compares its outputs with the recorded outputs of that service, in order.

Each core decides with the policy settings its service recorded in the log, when it did
(`recorded_settings`): then no settings file is needed, and the services' announcements of
their settings are compared like their decisions. A log with none replays with the settings
given. A what-if replay (other settings, over the recorded ones) chains the cores instead: the
speculator and blocklist read the findings the *replayed* detector emits, since with other
detector settings the recorded findings are no longer what they would have seen. It compares
decisions only, not the announcements, which name the what-if settings.

Outputs are matched to services by their id prefix (ids are `derived_id(service, ...)`), and both
sides are deduplicated by id: delivery is at least once, so a service that restarted may have
re-emitted a decision, which the agent ignored and the comparison must too.

A command the agent rejected for where it came from (unsigned, a bad signature, or a signer not
allowed that command: `model.authority`) was never a service decision: it is left out of the
comparison and listed in the report instead. The archive keeps commands with a bad signature
under their own topic, so they are told apart exactly even when one reuses a real decision's id;
read from the topics, a command is left out when the agent's answers to its id are all such
rejections. A recorded finding or command whose id names no service is a difference: no core
emits it, and if the agent took it, something other than the services commanded the job.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields

from tailguard.model import records as r
from tailguard.model.authority import (
    UNAUTHENTICATED_COMMANDS_TOPIC,
    is_authority_rejection,
    issuer_named_by,
)
from tailguard.model.config import SERVICES_KEY, Settings, parse_flag
from tailguard.replay.fleet_check import (
    check_fleet_commands,
    evidence_in_log,
    is_fleet_command,
)
from tailguard.replay.recorded_settings import SettingsPlan, plan_settings, run_planned
from tailguard.system.services import SERVICES, Service


@dataclass(frozen=True)
class Recorded:
    """One record of the log, with the topic it travelled on."""

    topic: str
    record: r.Record


@dataclass(frozen=True)
class Difference:
    position: int
    recorded: r.Record | None
    replayed: r.Record | None
    # Why a recorded record that is checked rather than reproduced failed its check.
    problem: str = ""

    def describe(self) -> str:
        if self.problem:
            assert self.recorded is not None
            return f"#{self.position}: {_short(self.recorded)} {self.problem}"
        if self.recorded is None:
            assert self.replayed is not None
            return f"#{self.position}: replay emitted {_short(self.replayed)}, not in the log"
        if self.replayed is None:
            return f"#{self.position}: log has {_short(self.recorded)}, replay did not emit it"
        changed = _changed_fields(self.recorded, self.replayed)
        return f"#{self.position}: {_short(self.recorded)} differs in {', '.join(changed)}"


@dataclass
class ServiceReport:
    service: str
    output_kind: str
    compared: bool  # False when the service did not run live for these jobs
    recorded: int = 0
    replayed: int = 0
    reproduced: int = 0
    # Fleet commands checked against the job's record instead of reproduced (`fleet_check`).
    checked: int = 0
    differences: list[Difference] = field(default_factory=list)

    def line(self) -> str:
        if not self.compared:
            return (
                f"{self.service}: not run live (services off); replay would emit "
                f"{self.replayed} {self.output_kind}"
            )
        checked = (
            f", {self.checked} fleet {self.output_kind} checked against the job's record"
            if self.checked
            else ""
        )
        return (
            f"{self.service}: {self.reproduced} {self.output_kind} reproduced{checked}, "
            f"{len(self.differences)} differences"
        )


@dataclass(frozen=True)
class RejectedCommand:
    """A command in the log that the agent rejected for where it came from."""

    command: r.Command
    # The agent's CommandRejected reason; empty if it never answered (it arrived after the end).
    reason: str

    def describe(self) -> str:
        return f"{_short(self.command)}: {self.reason or 'arrived after the job ended'}"


@dataclass
class ReplayReport:
    services: list[ServiceReport]
    jobs: list[str]
    events: int
    # Commands that were never service decisions: reported, not compared.
    rejected: list[RejectedCommand] = field(default_factory=list)
    # Findings and commands whose id names no service: no core emits them.
    unattributed: list[r.Record] = field(default_factory=list)
    # Per service, the settings its core was replayed with.
    settings: list[SettingsPlan] = field(default_factory=list)

    @property
    def differences(self) -> int:
        return sum(len(s.differences) for s in self.services) + len(self.unattributed)

    def notes(self, show: int) -> list[str]:
        """The report's lines beyond the services': unattributed records, rejected commands."""
        return [
            *_section(
                "record(s) whose id names no service (differences)",
                [_short(u) for u in self.unattributed],
                show,
            ),
            *_section(
                "command(s) the agent rejected as not from a permitted service "
                "(not decisions, left out of the comparison)",
                [c.describe() for c in self.rejected],
                show,
            ),
        ]


def _section(title: str, items: Sequence[str], show: int) -> list[str]:
    if not items:
        return []
    more = [f"    ... and {len(items) - show} more"] if len(items) > show else []
    return [f"{len(items)} {title}:", *(f"    {item}" for item in items[:show]), *more]


def _short(record: r.Record) -> str:
    return f"{type(record).__name__}({record.id})"


def _changed_fields(a: r.Record, b: r.Record) -> list[str]:
    if type(a) is not type(b):
        return [f"type ({type(a).__name__} vs {type(b).__name__})"]
    return [f.name for f in fields(a) if getattr(a, f.name) != getattr(b, f.name)] or ["nothing"]


def service_of(record: r.Record) -> str:
    """The service that emitted a finding or command (ids are `<service>-<hash>`)."""
    return issuer_named_by(record.id)


def dedupe(records: Iterable[r.Record]) -> list[r.Record]:
    seen: set[str] = set()
    out: list[r.Record] = []
    for record in records:
        if record.id not in seen:
            seen.add(record.id)
            out.append(record)
    return out


def _run(spec: Service, plan: SettingsPlan, inputs: Sequence[r.Record]) -> list[r.Record]:
    """What the service emits on `inputs` to the findings and commands (its settings' too):
    what the log holds of it (the blocklist's fleet list goes to a topic of its own, checked
    apart)."""
    logged = r.Finding | r.Command | r.PolicySettings
    return [o for o in run_planned(plan, spec.core, inputs) if isinstance(o, logged)]


def _compare(recorded: Sequence[r.Record], replayed: Sequence[r.Record]) -> list[Difference]:
    diffs: list[Difference] = []
    for i in range(max(len(recorded), len(replayed))):
        a = recorded[i] if i < len(recorded) else None
        b = replayed[i] if i < len(replayed) else None
        if a != b:
            diffs.append(Difference(i, a, b))
    return diffs


def _leave_out_rejected(
    commands: Sequence[r.Command | r.CommandSettings],
    unauthenticated: Sequence[r.Command],
    events: Sequence[r.Event],
) -> tuple[list[r.Command | r.CommandSettings], list[RejectedCommand]]:
    """The commands to compare, and the rejected ones: those archived as unauthenticated, and
    those whose every answer from the agent was a rejection for authority."""
    for_authority: dict[str, str] = {}
    taken: set[str] = set()
    for e in events:
        if isinstance(e, r.CommandRejected) and is_authority_rejection(e):
            for_authority.setdefault(e.command_id, e.reason)
        elif isinstance(e, r.CommandApplied | r.CommandRejected):
            taken.add(e.command_id)
    never_taken = for_authority.keys() - taken
    kept = [c for c in commands if c.id not in never_taken]
    left_out = [
        *unauthenticated,
        *(c for c in commands if c.id in never_taken and isinstance(c, r.Command)),
    ]
    # A forgery sent again is one entry; the same id with other content is another.
    unique = list(dict.fromkeys(left_out))
    return kept, [RejectedCommand(c, for_authority.get(c.id, "")) for c in unique]


def replay(
    log: Iterable[Recorded],
    settings: Settings,
    *,
    what_if: bool = False,
    job: str | None = None,
    progress: Callable[[int], None] | None = None,
    services: Sequence[Service] = SERVICES,
    overrides: Mapping[str, str] | None = None,
) -> ReplayReport:
    """Replay the cores of `services` (the table of the services) over `log` (every topic, in
    the order it was recorded). Each core decides with the settings its service recorded in
    the log, else with `settings`; a what-if puts `overrides` (by default, what `settings`
    sets) over the recorded ones."""
    if what_if and overrides is None:
        overrides = settings.overrides()
    events: list[r.Event] = []
    findings: list[r.Finding | r.FindingSettings] = []
    # The commands topic's records in their order, the services' announcements among them.
    commands: list[r.Command | r.CommandSettings] = []
    announced: list[r.PolicySettings] = []
    unauthenticated: list[r.Command] = []
    for n, item in enumerate(log, 1):
        record = item.record
        if job is not None and record.job_id != job:
            continue
        if item.topic == r.EVENTS_TOPIC and isinstance(record, r.Event):
            events.append(record)
        elif isinstance(record, r.Finding | r.FindingSettings) and item.topic == r.FINDINGS_TOPIC:
            # Not one the agent kept apart (`received_archive_topic`): the services refused it.
            findings.append(record)
            if isinstance(record, r.FindingSettings):
                announced.append(record)
        elif isinstance(record, r.CommandSettings) and item.topic == r.COMMANDS_TOPIC:
            commands.append(record)
            announced.append(record)
        elif isinstance(record, r.Command) and item.topic == UNAUTHENTICATED_COMMANDS_TOPIC:
            unauthenticated.append(record)
        elif isinstance(record, r.Command):
            commands.append(record)
        if progress is not None and n % 10_000 == 0:
            progress(n)
    commands, rejected = _leave_out_rejected(commands, unauthenticated, events)

    recorded_by_service: dict[str, list[r.Record]] = {s.name: [] for s in services}
    unattributed: list[r.Record] = []
    for out in dedupe([*findings, *commands]):
        if isinstance(out, r.PolicySettings) and out.service != service_of(out):
            unattributed.append(out)  # its id names another service than it says
        elif not (what_if and isinstance(out, r.PolicySettings)):  # a what-if: decisions only
            recorded_by_service.get(service_of(out), unattributed).append(out)

    live = _services_live(events)
    finding_ids = {f.id for f in findings}
    # What a what-if replay feeds the findings' readers: the findings the replayed services emit.
    replayed_findings: list[r.Record] = []
    reports: list[ServiceReport] = []
    plans: list[SettingsPlan] = []
    for spec in services:
        plan = plan_settings(
            spec.name, (a for a in announced if a.service == service_of(a)), settings, overrides
        )
        plans.append(plan)
        if spec.input_topic == r.EVENTS_TOPIC:
            inputs: Sequence[r.Record] = events
        elif spec.input_topic != r.FINDINGS_TOPIC:
            raise ValueError(
                f"replay feeds a core the events or the findings; {spec.name} reads "
                f"{spec.input_topic}"
            )
        elif what_if:
            inputs = dedupe(replayed_findings)
        else:
            inputs = dedupe(findings)
        replayed = dedupe(_run(spec, plan, inputs))
        replayed_findings.extend(
            o for o in replayed if isinstance(o, r.Finding | r.FindingSettings)
        )
        if what_if:
            replayed = [o for o in replayed if not isinstance(o, r.PolicySettings)]
        recorded = recorded_by_service.get(spec.name, [])
        compared = live or spec.local_fallback
        report = ServiceReport(spec.name, spec.output_kind, compared)
        report.recorded, report.replayed = len(recorded), len(replayed)
        fleet_checks: list[Difference] = []
        if compared and not evidence_in_log(recorded, finding_ids):
            # One job's log: the fleet's commands to it are checked, its own compared.
            fleet_checks = [
                Difference(p.position, p.command, None, p.problem)
                for p in check_fleet_commands(recorded, events, plan.settings)
            ]
            report.checked = sum(1 for c in recorded if is_fleet_command(c))
            recorded = [c for c in recorded if not is_fleet_command(c)]
            replayed = [c for c in replayed if not is_fleet_command(c)]
        if compared:
            report.differences = [*_compare(recorded, replayed), *fleet_checks]
            report.reproduced = sum(1 for a, b in zip(recorded, replayed, strict=False) if a == b)
        reports.append(report)
    jobs = sorted({e.job_id for e in events})
    return ReplayReport(reports, jobs, len(events), rejected, unattributed, plans)


def _services_live(events: Iterable[r.Event]) -> bool:
    """Whether the services ran: False only if every job says they were off."""
    flags: list[bool] = [
        _flag(e.config.get(SERVICES_KEY, "on")) for e in events if isinstance(e, r.JobSubmitted)
    ]
    return not flags or any(flags)


def _flag(value: str) -> bool:
    # The agent records "on" or "off"; anything else counts as on, as it always has.
    return parse_flag(value) is not False


def settings_diff(base: Settings, other: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """The policy settings a what-if replay changes: key -> (live value, what-if value)."""
    return {k: (base[k], v) for k, v in other.items() if k in base and base[k] != v}
