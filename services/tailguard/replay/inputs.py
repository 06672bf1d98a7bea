"""Where a replay reads its log from: a per-job archive (a file or a URI), or the Kafka topics."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from tailguard import filesystems
from tailguard.archive import ArchiveError, open_archive
from tailguard.codec import DecodeError, codec_for
from tailguard.kafka.signing import verifier_for
from tailguard.model import records as r
from tailguard.model.authority import input_problem, received_archive_topic
from tailguard.model.config import Settings
from tailguard.replay.engine import Recorded

if TYPE_CHECKING:
    from confluent_kafka import Message


class LogReadError(RuntimeError):
    """The log could not be read (missing file, not an archive, undecodable record)."""


def read_archive(location: str | Path, settings: Settings) -> Iterator[Recorded]:
    """Every record of an archive (a local path or a `pyarrow.fs` URI such as
    `s3://bucket/archive/job.avro`) in the order the agent wrote it.

    The agent archives what it published (events), what it received (findings and service
    commands) and the decisions it made itself as fallbacks (`local`); all of them are inputs or
    outputs of some core, so all are returned, each with the topic it travelled on (a command
    whose signature did not check out under `tailguard.commands.unauthenticated`). Typed archives
    and those of the older format (encoded records) are both read. A remote archive is reached
    with the `s3.*` settings, or the AWS default chain when none is set.
    """
    try:
        for envelope in open_archive(location, settings):
            yield Recorded(envelope.topic, envelope.record)
    except (ArchiveError, filesystems.LocationError) as err:
        raise LogReadError(str(err)) from None


def _read_topic(settings: Settings, topic: str, timeout_s: float = 10.0) -> list[Message]:
    """Every message of `topic` from its oldest to its current end, in partition-offset order."""
    # Here, not at the top: a replay of archives needs no Kafka client.
    from tailguard.kafka.topic_scan import TopicReadStalled, read_only_consumer, read_to_end

    # Assigned, never subscribed, never committed: a replay moves nobody's offsets.
    consumer = read_only_consumer(settings, "tailguard-replay")
    try:
        found = list(read_to_end(consumer, topic, stall_s=timeout_s))
    except TopicReadStalled as err:
        raise LogReadError(str(err)) from None
    finally:
        consumer.close()
    # Per-job order is per partition (the key is the job id): partition after partition (a
    # stable sort: each partition's messages came in offset order).
    return sorted(found, key=lambda msg: msg.partition() or 0)


def read_topic(settings: Settings, topic: str, job: str | None = None) -> Iterator[Recorded]:
    """One topic from the beginning up to its current end (a job's records only, if `job`);
    undecodable messages are skipped; LogReadError when the broker cannot be read.

    With signing on, what the services took is told from what they refused as the agent tells
    it on arrival (`received_archive_topic`): an event its agent did not sign is left out (a
    dead letter for every service, and no fact of the job's), a finding the services refused
    and a command whose signature does not check out come under the archive's topics for them,
    so the topics replay like the archives."""
    from tailguard.kafka.consumer import message_headers  # a Kafka client: see `_read_topic`

    codec = codec_for(settings)
    verifier = verifier_for(settings)
    try:
        messages = _read_topic(settings, topic)
    except LogReadError:
        raise
    except Exception as err:  # the broker is unreachable
        raise LogReadError(f"cannot read topic {topic}: {err}") from err
    for msg in messages:
        value = msg.value() or b""
        try:
            record = codec.decode(value)
        except DecodeError:
            continue  # a dead letter for the services too; not part of any decision
        if job is not None and record.job_id != job:
            continue
        origin = verifier.verify(topic, value, message_headers(msg.headers()))
        if isinstance(record, r.Event) and input_problem(topic, origin) is not None:
            continue
        yield Recorded(received_archive_topic(record, topic, origin) or topic, record)


def read_topics(settings: Settings, job: str | None = None) -> Iterator[Recorded]:
    """The three topics from the beginning up to their current end, topic after topic.

    Per-job order is what each core depends on, and Kafka keeps it within a partition (the key
    is the job id), so records are returned in partition-offset order with no cross-topic
    interleaving needed: the replay separates the topics again anyway.
    """
    for topic in r.TOPICS:
        yield from read_topic(settings, topic, job)
