"""The compacted topic `tailguard.blocklist`: the fleet blocklist as anyone reads it.

Key: the host (UTF-8). Value: a `FleetBlock` in Avro single-object encoding (`C3 01`, the
schema's CRC-64-AVRO fingerprint, the body: the records' `SingleObjectCodec`; schema
`schemas/blocklist/FleetBlock.avsc`), or no value at all (a tombstone) once the host is no
longer blocked. With `cleanup.policy=compact` Kafka keeps the last value per host (the embedded
Kafka broker creates the topic so, `kafka/topics.py`); compaction runs only now and then, and the
mock broker does not compact, so readers fold the whole topic the same way (last value per key
wins, a tombstone deletes), which is what a compacted topic gives them anyway.

Every value is signed like the services' other outputs (`kafka/signing.py`): by `blocklist` for
the service's decisions, by `operator` for `tailguard blocklist add|remove`. With signing on, a
reader ignores (and logs) an entry whose signature does not check out or whose signer may not
write the list (`model/authority.py`, `INPUT_WRITERS`).
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Message

from tailguard.codec.errors import DecodeError
from tailguard.codec.schemas import record_schema, schema_root
from tailguard.codec.single_object import SingleObjectCodec
from tailguard.kafka.producer import Headers, RecordProducer
from tailguard.kafka.signing import signer_for, verifier_for
from tailguard.kafka.topic_scan import read_only_consumer, read_to_end
from tailguard.model.authority import OPERATOR, input_problem
from tailguard.model.fleet import BLOCKLIST_TOPIC, FleetBlock
from tailguard.model.ids import derived_id

log = logging.getLogger(__name__)

_TIMEOUT_S = 10.0


def schema_json() -> dict[str, Any]:
    """The schema as written in its file (what the compatibility test reads)."""
    loaded: dict[str, Any] = json.loads(
        schema_root().joinpath("blocklist", "FleetBlock.avsc").read_text()
    )
    return loaded


@functools.cache
def _codec() -> SingleObjectCodec:
    """The records' own single-object codec, over the one FleetBlock schema."""
    schema = record_schema(schema_json(), FleetBlock)
    return SingleObjectCodec(current={"FleetBlock": schema}, released=())


def encode(entry: FleetBlock) -> tuple[bytes, bytes | None]:
    """(key, value) of one change of the list; the value is None for a removal (tombstone)."""
    key = entry.host.encode()
    if entry.until_ts is None:
        return key, None
    return key, _codec().encode(entry)


def decode(key: bytes, value: bytes | None) -> FleetBlock:
    """One message of the topic as a change of the list; a ValueError (`DecodeError`) names
    what is wrong."""
    host = key.decode()
    if value is None:
        return FleetBlock(job_id="", ts=0, id="", host=host, until_ts=None)
    try:
        entry = _codec().decode(value)
    except DecodeError as err:
        raise DecodeError(
            f"{BLOCKLIST_TOPIC} entry for {host!r} is not a FleetBlock: {err}"
        ) from None
    assert isinstance(entry, FleetBlock)
    if entry.host != host:
        raise DecodeError(f"{BLOCKLIST_TOPIC} entry keyed {host!r} names host {entry.host!r}")
    return entry


def operator_removal(host: str, now: int) -> FleetBlock:
    """The entry that takes `host` off the fleet list at `now`, as an operator's
    (`tailguard blocklist remove HOST`)."""
    entry_id = derived_id(OPERATOR, "remove", host, now)
    return FleetBlock(job_id=OPERATOR, ts=now, id=entry_id, host=host, until_ts=None)


def read_changes(settings: Mapping[str, str], timeout: float = _TIMEOUT_S) -> list[FleetBlock]:
    """Every change on the topic to its current end, in order (one partition per host key:
    the order that matters is per host). A missing topic is an empty list."""
    verifier = verifier_for(settings)
    consumer = read_only_consumer(settings, "tailguard-fleet-reader")
    try:
        messages = read_to_end(consumer, BLOCKLIST_TOPIC, stall_s=timeout)
        checked = (_checked(msg, verifier) for msg in messages)
        return [change for change in checked if change is not None]
    finally:
        consumer.close()


def _checked(msg: Message, verifier: Any) -> FleetBlock | None:
    value = msg.value()
    key = msg.key() or b""
    origin = verifier.verify(BLOCKLIST_TOPIC, value or b"", msg.headers() or [])
    problem = input_problem(BLOCKLIST_TOPIC, origin)
    if problem is not None:
        log.warning(
            "ignored %s entry for %r: %s", BLOCKLIST_TOPIC, key.decode(errors="replace"), problem
        )
        return None
    try:
        return decode(key, value)
    except ValueError as err:  # DecodeError, or a key that is not UTF-8
        log.warning("ignored %s entry at offset %s: %s", BLOCKLIST_TOPIC, msg.offset(), err)
        return None


def publish(settings: Mapping[str, str], entry: FleetBlock, signer: str) -> None:
    """Put one change of the list on the topic, signed as `signer`, and wait for delivery
    (`DeliveryError` if it was not delivered)."""
    key, value = encode(entry)
    headers: Headers = list(signer_for(settings, signer).headers(BLOCKLIST_TOPIC, value or b""))
    producer = RecordProducer(settings)
    producer.send_bytes(BLOCKLIST_TOPIC, key, value, headers)
    producer.flush(_TIMEOUT_S)
