"""Foreign bytes: whatever arrives, decode returns a record or raises DecodeError, nothing else."""

from __future__ import annotations

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from tests.examples_budget import examples
from tests.strategies import records

from tailguard.codec import ConfluentCodec, DecodeError, RecordCodec, SingleObjectCodec
from tailguard.codec import registry_client as _registry_client
from tailguard.codec.schemas import current_schemas, released_schemas
from tailguard.codec.single_object import MARKER
from tailguard.model.records import Record, UnblockNodes

SINGLE = SingleObjectCodec()
CONFLUENT = ConfluentCodec(_registry_client({"schema-registry.url": "mock://test-robustness"}))
CODECS = (SINGLE, CONFLUENT)
ROBUST = settings(
    max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def _decode_or_decode_error(codec: RecordCodec, data: bytes) -> Record | None:
    """The record, or None on DecodeError; any other exception fails the test."""
    try:
        record = codec.decode(data)
    except DecodeError as exc:
        assert str(exc), "a DecodeError must say what was wrong"
        return None
    assert isinstance(record, Record)
    return record


@ROBUST
@given(data=st.binary(max_size=200))
def test_random_bytes(data: bytes) -> None:
    for codec in CODECS:
        _decode_or_decode_error(codec, data)


KNOWN_FINGERPRINTS = sorted(
    {s.fingerprint for s in current_schemas().values()}
    | {s.fingerprint for v in released_schemas().values() for s in v.values()}
)


@ROBUST
@given(fingerprint=st.sampled_from(KNOWN_FINGERPRINTS), body=st.binary(max_size=200))
def test_random_bodies_behind_a_valid_header(fingerprint: bytes, body: bytes) -> None:
    # Random bytes almost never carry a known fingerprint; these reach the body reader.
    _decode_or_decode_error(SINGLE, MARKER + fingerprint + body)


@ROBUST
@given(record=records(), data=st.data())
def test_mutated_messages(record: Record, data: st.DataObject) -> None:
    for codec in CODECS:
        message = bytearray(codec.encode(record))
        # Mutate the body more than the header so that most mutants get past the lookup.
        header = 10 if codec is SINGLE else 5
        positions = st.integers(min_value=0, max_value=len(message) - 1)
        for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
            at = data.draw(positions | st.integers(min_value=header, max_value=len(message) - 1))
            message[at] = data.draw(st.integers(min_value=0, max_value=255))
        _decode_or_decode_error(codec, bytes(message))


@ROBUST
@given(record=records(), data=st.data())
def test_truncated_messages(record: Record, data: st.DataObject) -> None:
    for codec in CODECS:
        message = codec.encode(record)
        cut = data.draw(st.integers(min_value=0, max_value=len(message) - 1))
        assume(cut < len(message))
        try:
            codec.decode(message[:cut])
        except DecodeError:
            continue
        raise AssertionError(f"{codec.name}: a message cut at {cut}/{len(message)} decoded")


@ROBUST
@given(record=records(), extra=st.binary(min_size=1, max_size=8))
def test_trailing_bytes_are_rejected(record: Record, extra: bytes) -> None:
    for codec in CODECS:
        try:
            codec.decode(codec.encode(record) + extra)
        except DecodeError as exc:
            assert f"{len(extra)} trailing bytes" in str(exc)
            continue
        raise AssertionError(f"{codec.name}: trailing {extra!r} accepted")


def test_huge_counts_fail_fast() -> None:
    # An array block count of 2**62 with no items must end at the end of the data, not allocate.
    message = SINGLE.encode(UnblockNodes(job_id="j", ts=1, id="i", hosts=()))
    # UnblockNodes: job_id, ts, id, caused_by (array), hosts (array); the last byte is hosts' 0.
    n = 2**62
    zigzag = n << 1
    count = bytearray()
    while zigzag > 0x7F:
        count.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    count.append(zigzag)
    assert _decode_or_decode_error(SINGLE, message[:-1] + bytes(count)) is None
