"""`explain`: why a record is in the log, down to the events behind it. Pure.

A finding or command names its causes in `caused_by`; an event the agent took on a command
names it in `command_id`. Those links are followed, and a few the records imply are added:
- a slow-task finding lists the slow attempts: their deployment and last progress before it;
- an attempt's events lead to its deployment, and a deployment to what started it (the
  speculative launch, the restart, or the initialisation of its vertex);
- a lost race leads to the winner, a failure on a missing partition to the attempt that made it;
- an attempt a new driver reset after a crash leads to its takeover (`JobRecovered`).
Each record is shown once; a second path to it says so. What followed (the command applied,
the attempts it started and how they ended) is listed after the causes, and then the settings
each deciding core read, with the job's values.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from tailguard.inspect.describe import describe, relative
from tailguard.inspect.history import (
    ATTEMPT_END_TYPES,
    History,
    attempt_key,
    attempt_name,
)
from tailguard.inspect.settings_used import (
    JOB,
    SERVICE,
    ServiceSettings,
    services,
    settings_used,
)
from tailguard.model import records as r

MAX_SUGGESTIONS = 5


class UnknownId(LookupError):
    """No record of the job has that id (the message suggests close ones)."""


@dataclass(frozen=True)
class Step:
    via: str  # how the record relates to the step above it ("" at the top)
    record_id: str
    record: r.Record | None  # None: named by a record but not in the archive
    direction: str | None = None
    steps: tuple[Step, ...] = ()
    repeated: bool = False  # shown already, elsewhere in the tree


@dataclass(frozen=True)
class Explanation:
    job_id: str
    start_ts: int
    root: Step
    effects: tuple[Step, ...]
    settings: tuple[ServiceSettings, ...]
    # Deciders named in the chain that are not tailguard's cores (e.g. a test's commands).
    other_deciders: tuple[str, ...] = ()


def find(history: History, query: str) -> r.Record:
    """The record with id `query`, a unique id prefix, or an attempt named `vertex#s.a`."""
    record = history.record(query)
    if record is not None:
        return record
    for key, deploying in history.deploying.items():
        if attempt_name(*key) == query:
            return deploying
    matches = [i for i in history.by_id if i.startswith(query)]
    if len(matches) == 1:
        return history.by_id[matches[0]].record
    if matches:
        shown = ", ".join(matches[:MAX_SUGGESTIONS])
        extra = len(matches) - MAX_SUGGESTIONS
        more = f" and {extra} more" if extra > 0 else ""
        raise UnknownId(f"{query!r} is the start of {len(matches)} ids: {shown}{more}")
    names = [*history.by_id, *(attempt_name(*k) for k in history.deploying)]
    close = difflib.get_close_matches(query, names, n=MAX_SUGGESTIONS, cutoff=0.6)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    raise UnknownId(f"no record {query!r} in job {history.job_id}{hint}")


def explain(history: History, record: r.Record, depth: int = 12) -> Explanation:
    seen: set[str] = set()
    root = _step(history, "", record.id, depth, seen)
    shown: set[str] = {record.id}
    effects = tuple(_effects(history, record.id, 3, shown))
    deciders = list(dict.fromkeys(_deciders(root)))
    known = set(services())
    return Explanation(
        job_id=history.job_id,
        start_ts=history.start_ts,
        root=root,
        effects=effects,
        settings=tuple(settings_used(s, history) for s in deciders if s in known),
        other_deciders=tuple(s for s in deciders if s not in known),
    )


def decider_of(record: r.Record) -> str | None:
    """The service that decided a finding or command (ids are `<service>-<hash>`)."""
    if isinstance(record, r.Finding | r.Command):
        return record.id.split("-", 1)[0]
    return None


def _deciders(step: Step) -> list[str]:
    found = [d] if step.record is not None and (d := decider_of(step.record)) else []
    for child in step.steps:
        found += _deciders(child)
    return found


def _step(history: History, via: str, record_id: str, depth: int, seen: set[str]) -> Step:
    record = history.record(record_id)
    direction = history.direction(record_id)
    if record is None:
        return Step(via, record_id, None)
    if record_id in seen:
        return Step(via, record_id, record, direction, repeated=True)
    seen.add(record_id)
    if depth <= 0:
        return Step(via, record_id, record, direction)
    children = tuple(
        _step(history, child_via, child_id, depth - 1, seen)
        for child_via, child_id in _causes(history, record)
    )
    return Step(via, record_id, record, direction, children)


def _causes(history: History, record: r.Record) -> list[tuple[str, str]]:
    """(how, id) of each record `record` follows from."""
    found: list[tuple[str, str]] = []
    if isinstance(record, r.Finding | r.Command):
        found += [("caused by", ref) for ref in record.caused_by]
    if isinstance(record, r.SlowTasksDetected):
        found += _slow_attempts(history, record)
    if isinstance(record, r.AttemptDeploying):
        cause = history.deploy_cause.get(attempt_key(record))
        if cause is not None:
            found.append(("started by", cause))
    elif isinstance(record, (*ATTEMPT_END_TYPES, r.AttemptProgress)):
        deploying = history.deploying.get(attempt_key(record))
        if deploying is not None:
            found.append(("the attempt", deploying.id))
    elif getattr(record, "command_id", None):
        found.append(("on command", str(getattr(record, "command_id", ""))))
    if isinstance(record, r.AttemptCanceled) and record.reason is r.CancelReason.LOST_RACE:
        winner = _winner(history, record)
        if winner is not None:
            found.append(("lost to", winner.id))
    if isinstance(record, r.AttemptCanceled) and record.reason is r.CancelReason.RESTART:
        ref = r.AttemptRef(record.vertex, record.subtask, record.attempt)
        found += [
            ("reset by the driver's recovery", e.id)
            for e in history.records
            if isinstance(e, r.JobRecovered) and ref in e.reset_attempts
        ]
    if isinstance(record, r.AttemptFailed) and record.missing_partition is not None:
        p = record.missing_partition
        producer = history.ended.get((p.vertex, p.subtask, p.attempt))
        if producer is not None:
            found.append(("missing partition made by", producer.id))
    return found


def _slow_attempts(history: History, finding: r.SlowTasksDetected) -> list[tuple[str, str]]:
    """The deployment and the last progress before the finding of each slow attempt."""
    found: list[tuple[str, str]] = []
    for subtask in finding.slow:
        for attempt in subtask.live_attempts:
            if not attempt.slow:
                continue
            key = (finding.vertex, subtask.subtask, attempt.attempt)
            via = f"slow attempt {attempt_name(*key)}"
            deploying = history.deploying.get(key)
            if deploying is not None:
                found.append((via, deploying.id))
            progress = [
                e
                for e in history.records
                if isinstance(e, r.AttemptProgress) and attempt_key(e) == key and e.ts <= finding.ts
            ]
            if progress:
                found.append((via, progress[-1].id))
    return found


def _winner(history: History, lost: r.AttemptCanceled) -> r.AttemptFinished | None:
    finished = [
        e
        for e in history.records
        if isinstance(e, r.AttemptFinished)
        and (e.vertex, e.subtask) == (lost.vertex, lost.subtask)
        and e.ts <= lost.ts
    ]
    return finished[-1] if finished else None


def _effects(history: History, record_id: str, depth: int, shown: set[str]) -> list[Step]:
    """What followed from a record: the records naming it, and how started attempts ended."""
    if depth <= 0:
        return []
    followers = list(history.referenced_by.get(record_id, ()))
    record = history.record(record_id)
    if isinstance(record, r.AttemptDeploying):
        end = history.ended.get(attempt_key(record))
        if end is not None:
            followers.append(end)
    steps: list[Step] = []
    for follower in followers:
        if follower.id in shown:
            continue
        shown.add(follower.id)
        nested = tuple(_effects(history, follower.id, depth - 1, shown))
        steps.append(Step("then", follower.id, follower, history.direction(follower.id), nested))
    return steps


# --------------------------------------------------------------------------- text

# scope -> (tag, note)
_SCOPES = {
    JOB: (
        "per job",
        "Read per job from JobSubmitted.config; a key set in the service's own settings file "
        "would win over it.",
    ),
    SERVICE: (
        "at service start",
        "Read once when the service starts, from its own settings file, which the archive does "
        "not hold: the job's values are shown.",
    ),
}
# The same, for a service that recorded its settings in the log (model.policy_settings).
_RECORDED = (
    "The service's own settings are those it announced to this job (settings version "
    "{version}), which a replay decides with."
)
_DIRECTIONS = {
    "received": "from the services",
    "local": "the agent's own fallback decision",
}


def _line(step: Step, start_ts: int, arrow: str) -> list[str]:
    via = f"{step.via}: " if step.via else ""
    if step.record is None:
        return [f"{arrow}{via}{step.record_id} (not in this archive)"]
    record = step.record
    where = _DIRECTIONS.get(step.direction or "", "")
    head = f"{arrow}{via}{type(record).__name__} {record.id} at {relative(record.ts, start_ts)}"
    if where:
        head += f" ({where})"
    if step.repeated:
        return [head + " (shown above)"]
    return [head, f"{' ' * len(arrow)}  {describe(record, start_ts)}"]


def _tree(step: Step, start_ts: int, indent: str, arrow: str) -> list[str]:
    lines = [indent + line for line in _line(step, start_ts, arrow)]
    for child in step.steps:
        lines += _tree(child, start_ts, indent + "  ", arrow or "← ")
    return lines


def render_text(explanation: Explanation) -> str:
    start = explanation.start_ts
    lines = [f"job {explanation.job_id}", ""]
    lines += _tree(explanation.root, start, "", "")
    if explanation.effects:
        lines += ["", "what followed:"]
        for effect in explanation.effects:
            lines += _tree(effect, start, "  ", "→ ")
    for used in explanation.settings:
        over = (
            "its recorded settings, the job's config where they set nothing"
            if used.version
            else "the job's config over the defaults"
        )
        lines += ["", f"settings the {used.service} read ({over}):"]
        if used.problem:
            lines.append(f"  ({used.problem})")
        scopes = {s.scope for s in used.settings}
        width = max((len(s.key) for s in used.settings), default=0)
        for s in used.settings:
            tag = f", {_SCOPES[s.scope][0]}" if len(scopes) > 1 else ""
            lines.append(f"  {s.key:<{width}} = {s.value}  ({s.source}{tag})")
        recorded = [f"  {_RECORDED.format(version=used.version)}"] if used.version else []
        lines += [
            f"  {_SCOPES[scope][1]}"
            for scope in sorted(scopes)
            if not (recorded and scope == SERVICE)
        ] + recorded
    for other in explanation.other_deciders:
        lines += ["", f"{other}: not a tailguard service, no settings to show"]
    return "\n".join(lines) + "\n"
