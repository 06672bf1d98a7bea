"""The compacted topic `tailguard.blocklist`: the fleet blocklist as anyone reads it.

Key: the host (UTF-8). Value: a `FleetBlock` in Avro single-object encoding (`C3 01`, the
schema's CRC-64-AVRO fingerprint, the body; schema `schemas/blocklist/FleetBlock.avsc`), or no
value at all (a tombstone) once the host is no longer blocked. With `cleanup.policy=compact`
Kafka keeps the last value per host; the embedded broker does not compact, so readers fold the
whole topic the same way (last value per key wins, a tombstone deletes), which is what a
compacted topic gives them anyway.

Every value is signed like the services' other outputs (`log/signing.py`): by `blocklist` for
the service's decisions, by `operator` for `tailguard blocklist add|remove`. With signing on, a
reader ignores (and logs) an entry whose signature does not check out or whose signer may not
write the list (`model/authority.py`, `FLEET_WRITERS`).
"""

from __future__ import annotations

import functools
import io
import json
import logging
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.schema import fingerprint, to_parsing_canonical_form

from tailguard.codec.schemas import schema_root
from tailguard.log.kafka_config import client_config
from tailguard.log.producer import producer_config
from tailguard.log.signing import signer_for, verifier_for
from tailguard.model.authority import FLEET_WRITERS, Signed, Unauthentic, shown
from tailguard.model.fleet import BLOCKLIST_TOPIC, FleetBlock

log = logging.getLogger(__name__)

MARKER = b"\xc3\x01"
# Topic settings for a real Kafka cluster (`kafka-topics --create --config ...`): keep the last
# value per host, and drop tombstones a day after they were written.
TOPIC_CONFIG = {"cleanup.policy": "compact", "delete.retention.ms": "86400000"}

_TIMEOUT_S = 10.0


@functools.cache
def _schema() -> tuple[Any, bytes]:
    raw = json.loads(schema_root().joinpath("blocklist", "FleetBlock.avsc").read_text())
    parsed = parse_schema(raw, named_schemas={})
    canonical = to_parsing_canonical_form(parsed)
    return parsed, MARKER + bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO"))


def schema_json() -> dict[str, Any]:
    """The schema as written in its file (what the compatibility test reads)."""
    loaded: dict[str, Any] = json.loads(
        schema_root().joinpath("blocklist", "FleetBlock.avsc").read_text()
    )
    return loaded


def encode(entry: FleetBlock) -> tuple[bytes, bytes | None]:
    """(key, value) of one change of the list; the value is None for a removal (tombstone)."""
    key = entry.host.encode()
    if entry.until_ts is None:
        return key, None
    parsed, header = _schema()
    body = io.BytesIO()
    schemaless_writer(
        body,
        parsed,
        {
            "job_id": entry.job_id,
            "ts": entry.ts,
            "id": entry.id,
            "host": entry.host,
            "until_ts": entry.until_ts,
            "cause": entry.cause,
            "evidence": list(entry.evidence),
        },
    )
    return key, header + body.getvalue()


def decode(key: bytes, value: bytes | None) -> FleetBlock:
    """One message of the topic as a change of the list; a ValueError names what is wrong."""
    host = key.decode()
    if value is None:
        return FleetBlock(job_id="", ts=0, id="", host=host, until_ts=None)
    parsed, header = _schema()
    if value[: len(header)] != header:
        raise ValueError(
            f"{BLOCKLIST_TOPIC} entry for {host!r} is not a FleetBlock in single-object "
            f"encoding (starts {value[:10].hex()}, expected {header.hex()})"
        )
    data = schemaless_reader(io.BytesIO(value[len(header) :]), parsed, parsed)
    assert isinstance(data, dict)
    if data["host"] != host:
        raise ValueError(f"{BLOCKLIST_TOPIC} entry keyed {host!r} names host {data['host']!r}")
    return FleetBlock(
        job_id=data["job_id"],
        ts=data["ts"],
        id=data["id"],
        host=host,
        until_ts=data["until_ts"],
        cause=data["cause"],
        evidence=tuple(data["evidence"]),
    )


def read_changes(settings: Mapping[str, str], timeout: float = _TIMEOUT_S) -> list[FleetBlock]:
    """Every change on the topic to its current end, in order (one partition per host key:
    the order that matters is per host). A missing topic is an empty list."""
    verifier = verifier_for(settings)
    consumer = Consumer(
        client_config(
            settings,
            "consumer",
            {
                "group.id": "tailguard-fleet-reader",
                "enable.auto.commit": False,
                "allow.auto.create.topics": False,
                "log_level": 3,
            },
        )
    )
    changes: list[FleetBlock] = []
    try:
        meta = consumer.list_topics(BLOCKLIST_TOPIC, timeout=timeout).topics.get(BLOCKLIST_TOPIC)
        if meta is None or meta.error is not None or not meta.partitions:
            return []
        ends: dict[int, int] = {}
        for p in sorted(meta.partitions):
            low, high = consumer.get_watermark_offsets(
                TopicPartition(BLOCKLIST_TOPIC, p), timeout=timeout
            )
            if high > low:
                ends[p] = high
        consumer.assign([TopicPartition(BLOCKLIST_TOPIC, p, OFFSET_BEGINNING) for p in ends])
        deadline = time.monotonic() + timeout
        while ends:
            msg = consumer.poll(max(0.0, deadline - time.monotonic()))
            if msg is None:
                raise TimeoutError(f"reading {BLOCKLIST_TOPIC}: {ends} not reached in {timeout} s")
            if msg.error():
                raise KafkaException(msg.error())
            partition, offset = msg.partition() or 0, msg.offset() or 0
            if offset + 1 >= ends.get(partition, 0):
                ends.pop(partition, None)
            change = _checked(msg, verifier)
            if change is not None:
                changes.append(change)
        return changes
    finally:
        consumer.close()


def _checked(msg: Message, verifier: Any) -> FleetBlock | None:
    value = msg.value()
    key = msg.key() or b""
    origin = verifier.verify(BLOCKLIST_TOPIC, value or b"", msg.headers() or [])
    problem = None
    if isinstance(origin, Unauthentic):
        problem = origin.reason
    elif isinstance(origin, Signed) and origin.signer not in FLEET_WRITERS:
        problem = f"{shown(origin.signer)} may not write the fleet list"
    if problem is not None:
        log.warning(
            "ignored %s entry for %r: %s", BLOCKLIST_TOPIC, key.decode(errors="replace"), problem
        )
        return None
    try:
        return decode(key, value)
    except (ValueError, UnicodeDecodeError, EOFError) as err:
        log.warning("ignored %s entry at offset %s: %s", BLOCKLIST_TOPIC, msg.offset(), err)
        return None


def publish(settings: Mapping[str, str], entry: FleetBlock, signer: str) -> None:
    """Put one change of the list on the topic, signed as `signer`, and wait for delivery."""
    key, value = encode(entry)
    headers: list[tuple[str, str | bytes | None]] = list(
        signer_for(settings, signer).headers(BLOCKLIST_TOPIC, value or b"")
    )
    producer = Producer(producer_config(settings))
    errors: list[str] = []
    producer.produce(
        BLOCKLIST_TOPIC,
        key=key,
        value=value,
        headers=headers,
        on_delivery=lambda err, _msg: errors.append(str(err)) if err else None,
    )
    if producer.flush(_TIMEOUT_S) or errors:
        raise RuntimeError(f"{BLOCKLIST_TOPIC}: not delivered: {errors or 'timed out'}")
