"""Where a replay reads its log from: a per-job archive file, or the Kafka topics."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from tailguard.codec import DecodeError, codec_for
from tailguard.log.archive import ArchiveError, ArchiveReader
from tailguard.model import records as r
from tailguard.model.config import Settings
from tailguard.replay.engine import Recorded


class LogReadError(RuntimeError):
    """The log could not be read (missing file, not an archive, undecodable record)."""


def read_archive(path: Path, settings: Settings) -> Iterator[Recorded]:
    """Every record of an archive in the order the agent wrote it.

    The agent archives what it published (events), what it received (findings and service
    commands) and the decisions it made itself as fallbacks (`local`); all of them are inputs or
    outputs of some core, so all are returned.
    """
    if not path.is_file():
        raise LogReadError(f"no archive at {path}")
    codec = codec_for(settings)
    try:
        reader = ArchiveReader(path)
        for n, envelope in enumerate(reader):
            try:
                record = codec.decode(envelope.payload)
            except DecodeError as err:
                raise LogReadError(f"{path}: entry {n} does not decode: {err}") from None
            yield Recorded(envelope.topic, record)
    except ArchiveError as err:
        raise LogReadError(str(err)) from None


def read_topics(settings: Settings, job: str | None = None) -> Iterator[Recorded]:
    """The three topics from the beginning up to their current end, topic after topic.

    Per-job order is what each core depends on, and Kafka keeps it within a partition (the key
    is the job id), so records are returned in partition-offset order with no cross-topic
    interleaving needed: the replay separates the topics again anyway.
    """
    from tailguard.log.consumer import read_to_end

    codec = codec_for(settings)
    for topic in r.TOPICS:
        try:
            consumed = list(read_to_end(settings, codec, topic))
        except Exception as err:  # the broker or topic is unavailable
            raise LogReadError(f"cannot read topic {topic}: {err}") from err
        for item in consumed:
            if job is None or item.record.job_id == job:
                yield Recorded(topic, item.record)
