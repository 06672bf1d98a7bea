"""One job's archived records, indexed for the questions the timeline and `explain` ask.

Pure: built from records already decoded, in the order the agent archived them. That order is
the agent's (events in the order it published them, findings and commands as they arrived), so
it is kept as it is, and times come from each record's own `ts`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tailguard.model import records as r

AttemptKey = tuple[str, int, int]
AttemptEnd = r.AttemptFinished | r.AttemptFailed | r.AttemptCanceled
AttemptEvent = r.AttemptDeploying | AttemptEnd | r.AttemptProgress
ATTEMPT_END_TYPES = (r.AttemptFinished, r.AttemptFailed, r.AttemptCanceled)


class HistoryError(ValueError):
    """The records do not make one job's history (none, or several without a choice)."""


@dataclass(frozen=True, slots=True)
class Archived:
    """One archive entry: the record and how it relates to the agent that archived it."""

    record: r.Record
    # "published" (the agent's own events), "received" (the services' findings and commands)
    # or "local" (a decision the agent took itself as a fallback), as the archive says.
    direction: str = "published"
    # When the agent archived it (ms since the epoch); the record's own time is `record.ts`.
    archived_ts: int = 0
    # The topic it travelled on, as archived: `tailguard.commands.unauthenticated` for a command
    # whose signature did not check out; None: its record type's topic.
    archived_topic: str | None = None

    @property
    def topic(self) -> str:
        return self.archived_topic or self.record.TOPIC


def attempt_key(event: AttemptEvent) -> AttemptKey:
    return (event.vertex, event.subtask, event.attempt)


def attempt_name(vertex: str, subtask: int, attempt: int | None = None) -> str:
    """`vertex#subtask.attempt`, the way the timeline and `explain` name an attempt."""
    return f"{vertex}#{subtask}" if attempt is None else f"{vertex}#{subtask}.{attempt}"


@dataclass(frozen=True)
class History:
    job_id: str
    entries: tuple[Archived, ...]
    by_id: Mapping[str, Archived]
    deploying: Mapping[AttemptKey, r.AttemptDeploying]
    ended: Mapping[AttemptKey, AttemptEnd]
    # The id of the record that made the agent start each attempt: the command for a
    # speculative copy or a restart, the vertex's VertexInitialized for a first attempt; None
    # when the archive holds no such record.
    deploy_cause: Mapping[AttemptKey, str | None]
    start_ts: int
    end_ts: int
    submitted: r.JobSubmitted | None = None
    finished: r.JobFinished | None = None
    # Ids referenced by other records (caused_by, command_id) -> the records referencing them.
    referenced_by: Mapping[str, tuple[r.Record, ...]] = field(default_factory=dict)

    @property
    def records(self) -> list[r.Record]:
        return [entry.record for entry in self.entries]

    def record(self, record_id: str) -> r.Record | None:
        entry = self.by_id.get(record_id)
        return None if entry is None else entry.record

    def direction(self, record_id: str) -> str | None:
        entry = self.by_id.get(record_id)
        return None if entry is None else entry.direction

    def config(self) -> dict[str, str]:
        """The job's own settings, as `JobSubmitted.config` recorded them."""
        return dict(self.submitted.config) if self.submitted is not None else {}


def references(record: r.Record) -> tuple[str, ...]:
    """The ids a record names as its causes: `caused_by`, and `command_id` of an event."""
    ids: tuple[str, ...] = ()
    if isinstance(record, r.Finding | r.Command):
        ids = record.caused_by
    command_id = getattr(record, "command_id", None)
    if isinstance(command_id, str) and command_id:
        ids = (*ids, command_id)
    return ids


def history_of(entries: Iterable[Archived | r.Record], job_id: str | None = None) -> History:
    """The history of `job_id`, or of the only job in `entries`."""
    items = [e if isinstance(e, Archived) else Archived(e) for e in entries]
    jobs = list(dict.fromkeys(e.record.job_id for e in items))
    if not jobs:
        raise HistoryError("the archive holds no records")
    if job_id is None:
        if len(jobs) > 1:
            raise HistoryError(f"the archive holds {len(jobs)} jobs, choose one: {', '.join(jobs)}")
        job_id = jobs[0]
    elif job_id not in jobs:
        raise HistoryError(f"no job {job_id!r} in the archive (it holds {', '.join(jobs)})")
    mine = tuple(e for e in items if e.record.job_id == job_id)

    by_id: dict[str, Archived] = {}
    deploying: dict[AttemptKey, r.AttemptDeploying] = {}
    ended: dict[AttemptKey, AttemptEnd] = {}
    referenced_by: dict[str, list[r.Record]] = {}
    submitted: r.JobSubmitted | None = None
    finished: r.JobFinished | None = None
    for entry in mine:
        record = entry.record
        # At-least-once delivery: a re-emitted decision has the same id; the first one counts.
        by_id.setdefault(record.id, entry)
        for ref in references(record):
            referenced_by.setdefault(ref, []).append(record)
        if isinstance(record, r.AttemptDeploying):
            deploying[attempt_key(record)] = record
        elif isinstance(record, ATTEMPT_END_TYPES):
            ended.setdefault(attempt_key(record), record)
        elif isinstance(record, r.JobSubmitted) and submitted is None:
            submitted = record
        elif isinstance(record, r.JobFinished):
            finished = record
    times = [e.record.ts for e in mine]
    start_ts = submitted.ts if submitted is not None else min(times)
    end_ts = finished.ts if finished is not None else max(times)
    return History(
        job_id=job_id,
        entries=mine,
        by_id=by_id,
        deploying=deploying,
        ended=ended,
        deploy_cause=_deploy_causes(mine, by_id),
        start_ts=start_ts,
        end_ts=max(end_ts, start_ts),
        submitted=submitted,
        finished=finished,
        referenced_by={k: tuple(v) for k, v in referenced_by.items()},
    )


def _deploy_causes(
    entries: Iterable[Archived], by_id: Mapping[str, Archived]
) -> dict[AttemptKey, str | None]:
    """Why each attempt was started. A speculative copy names its command; the agent deploys
    a first attempt once its vertex is initialised and a later one after a restart, and names
    neither, so those are found from the latest initialisation, applied restart or driver
    recovery (`JobRecovered`) before it."""
    initialized: dict[str, str] = {}
    restarted: dict[tuple[str, int], str] = {}
    causes: dict[AttemptKey, str | None] = {}
    for entry in entries:
        record = entry.record
        if isinstance(record, r.VertexInitialized):
            initialized[record.vertex] = record.id
        elif isinstance(record, r.CommandApplied) and record.command_type == "RestartTasks":
            command = by_id.get(record.command_id)
            if command is not None and isinstance(command.record, r.RestartTasks):
                for task in command.record.tasks:
                    restarted[(task.vertex, task.subtask)] = command.record.id
        elif isinstance(record, r.JobRecovered):
            # A new driver runs again what was running at the crash and what was lost.
            again = [(a.vertex, a.subtask) for a in record.reset_attempts]
            again += [
                (lost.partition.vertex, lost.partition.subtask) for lost in record.lost_results
            ]
            for vertex_subtask in again:
                restarted[vertex_subtask] = record.id
        elif isinstance(record, r.AttemptDeploying):
            if record.command_id or record.speculative:
                cause: str | None = record.command_id
            elif (record.vertex, record.subtask) in restarted:
                cause = restarted[(record.vertex, record.subtask)]
            else:
                cause = initialized.get(record.vertex)
            causes[attempt_key(record)] = cause
    return causes
