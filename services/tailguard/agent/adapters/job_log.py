"""Reading a dead driver's log for its recovery: the job's archive, completed from the topics.

The archive is what the driver wrote itself, but a driver killed with `-9` loses the records it
had not flushed yet (and may leave half a block, which the archive writer cuts before it goes on).
The events topic holds every event the services saw, which is what the new driver must continue
from for them to see one continuous job. So the log is the archive's events, plus those of the
topic that the archive lacks, in the driver's own order (event sequence numbers); commands come
from both too (a restart's content is needed to rebuild it). The events the archive lacked are
returned apart, for the recovered run to archive before its own, so the archive again holds the
whole log and a replay of it has nothing missing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from tailguard import filesystems
from tailguard.agent.driver.recovery import JobLog, RecoveryError, sequence_of
from tailguard.archive import ArchiveError, archive_exists
from tailguard.model import records as r
from tailguard.model.authority import UNAUTHENTICATED_COMMANDS_TOPIC
from tailguard.model.config import Settings
from tailguard.replay.engine import Recorded

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RecoveryLog:
    job_log: JobLog
    # Events of the log that the archive does not hold (in order): archived first on recovery.
    not_archived: tuple[r.Event, ...]
    # The services' decisions and announcements on the topics that the archive does not hold
    # (the dead driver received them but lost them with its unflushed records): archived as
    # received, so a replay of the archive has every service's input and output.
    decisions_not_archived: tuple[Recorded, ...] = ()


def _archive_records(location: str, settings: Settings) -> list[Recorded] | None:
    """The archive's records (as `tailguard replay` reads them), or None when there is none."""
    from tailguard.replay.inputs import LogReadError, read_archive

    try:
        filesystems.configure_from(settings)  # how `archive_exists` reaches a URI
        if not archive_exists(location):
            return None
        return list(read_archive(location, settings))
    except (ArchiveError, LogReadError, OSError, filesystems.LocationError) as err:
        raise RecoveryError(f"the job's archive cannot be read: {err}") from None


def _topic_records(job_id: str, settings: Settings) -> list[Recorded] | None:
    """The job's events, findings and commands on the topics, or None when the broker cannot be
    read."""
    from tailguard.replay.inputs import LogReadError, read_topic

    try:
        return [
            item
            for topic in (r.EVENTS_TOPIC, r.FINDINGS_TOPIC, r.COMMANDS_TOPIC)
            for item in read_topic(settings, topic, job_id)
        ]
    except LogReadError as err:
        log.warning(
            "job %s: the topics cannot be read (%s); recovering from the archive", job_id, err
        )
        return None


def read_recovery_log(
    job_id: str, archive: str, settings: Settings, *, topics: bool
) -> RecoveryLog:
    """The job's log from its archive at `archive`, completed from the topics when `topics`."""
    archived = _archive_records(archive, settings)
    on_topics = _topic_records(job_id, settings) if topics else None
    if archived is None and not on_topics:
        raise RecoveryError(
            f"job {job_id}: no archive at {archive}"
            + ("" if topics else " (and the topics were not read: log mode 'archive')")
            + " and no events on the topics: there is nothing to recover from"
        )
    events: dict[str, r.Event] = {}
    commands: dict[str, r.Command] = {}

    def take(items: Iterable[Recorded]) -> None:
        # One rule for both sources: a command whose signature failed is kept apart in the
        # archive and by the topic read alike, and is no decision to restore.
        for item in items:
            record = item.record
            if record.job_id != job_id:
                continue
            if item.topic == r.EVENTS_TOPIC and isinstance(record, r.Event):
                events.setdefault(record.id, record)
            elif isinstance(record, r.Command) and item.topic != UNAUTHENTICATED_COMMANDS_TOPIC:
                commands.setdefault(record.id, record)

    take(archived or [])
    in_archive = set(events)
    archived_decisions = {
        (item.topic, item.record.id)
        for item in archived or []
        if item.record.job_id == job_id and item.topic != r.EVENTS_TOPIC
    }
    take(on_topics or [])
    ordered = sorted(events.values(), key=lambda e: sequence_of(job_id, e))
    not_archived = tuple(e for e in ordered if e.id not in in_archive)
    decisions_not_archived = tuple(
        item
        for item in on_topics or []
        if item.record.job_id == job_id
        and item.topic != r.EVENTS_TOPIC
        and (item.topic, item.record.id) not in archived_decisions
    )
    if archived is None:
        source = "the events topic (no archive)"
    elif not_archived:
        source = f"the archive and the events topic ({len(not_archived)} events not archived)"
    else:
        source = "the archive"
    return RecoveryLog(
        JobLog(job_id, tuple(ordered), commands, source), not_archived, decisions_not_archived
    )
