"""Signing records (`kafka.signing`): a round trip, every kind of tampering, wrong and rotated keys,
unsigned records, the settings, and the services' processor signing what it emits."""

from __future__ import annotations

import pytest

from tailguard.codec import codec_for
from tailguard.kafka.dead_letters import HEADER_ERROR
from tailguard.kafka.signing import (
    KEY_ID_HEADER,
    KEY_SETTING,
    PREVIOUS_KEYS_SETTING,
    SIGNATURE_HEADER,
    SIGNER_HEADER,
    NoSigning,
    NoVerification,
    RecordSigner,
    SignatureVerifier,
    SigningKey,
    signer_for,
    verifier_for,
)
from tailguard.model import records as r
from tailguard.model.authority import Signed, Unauthentic, Unchecked
from tailguard.model.config import ConfigError, Settings
from tailguard.shell.processor import Processor
from tailguard.system.services import Service

KEY = SigningKey(b"k" * 32)
OTHER_KEY = SigningKey(b"o" * 32)
TOPIC = r.COMMANDS_TOPIC
CODEC = codec_for(Settings())
FAIL = r.FailJob(job_id="job", ts=5, id="failover-1", caused_by=("job-e9",), reason="limit")
VALUE = CODEC.encode(FAIL)


def signed(key: SigningKey = KEY, signer: str = "failover", value: bytes = VALUE) -> list:
    return RecordSigner(key, signer).headers(TOPIC, value)


def replaced(headers: list, name: str, value: bytes) -> list:
    return [(n, value if n == name else v) for n, v in headers]


def verify(headers: list, value: bytes = VALUE, topic: str = TOPIC, keys=(KEY,)) -> object:
    return SignatureVerifier(keys).verify(topic, value, headers)


def test_a_signed_record_verifies_with_its_signer_and_key_id() -> None:
    headers = signed()
    assert [name for name, _ in headers] == [SIGNER_HEADER, KEY_ID_HEADER, SIGNATURE_HEADER]
    assert verify(headers) == Signed("failover", KEY.key_id)
    # The same record signed again gives the same headers: a service that re-emits a decision
    # after a restart re-sends the same bytes.
    assert signed() == headers


def test_a_changed_body_does_not_verify() -> None:
    forged = CODEC.encode(r.FailJob(job_id="job", ts=5, id="failover-1", reason="other"))
    result = verify(signed(), value=forged)
    assert isinstance(result, Unauthentic)
    assert result.reason.startswith("signature does not match (claims signer 'failover'")
    # One flipped bit anywhere in the value.
    flipped = bytes([VALUE[0] ^ 1]) + VALUE[1:]
    assert isinstance(verify(signed(), value=flipped), Unauthentic)


@pytest.mark.parametrize(
    ("header", "value"),
    [
        (SIGNER_HEADER, b"decider"),  # a signer swapped for another
        (KEY_ID_HEADER, OTHER_KEY.key_id.encode()),  # a key id swapped (unknown to the verifier)
        (SIGNATURE_HEADER, b"0" * 64),  # a made-up signature
        (SIGNATURE_HEADER, b""),
    ],
)
def test_a_changed_header_does_not_verify(header: str, value: bytes) -> None:
    assert isinstance(verify(replaced(signed(), header, value)), Unauthentic)


def test_a_signature_for_another_topic_does_not_verify() -> None:
    headers = RecordSigner(KEY, "failover").headers(r.FINDINGS_TOPIC, VALUE)
    assert isinstance(verify(headers), Unauthentic)


def test_a_record_signed_with_another_key_does_not_verify() -> None:
    result = verify(signed(OTHER_KEY))
    assert result == Unauthentic(f"signed with an unknown key (id '{OTHER_KEY.key_id}')")
    # Even under the right key id, the wrong secret gives the wrong signature.
    impostor = replaced(signed(OTHER_KEY), KEY_ID_HEADER, KEY.key_id.encode())
    assert isinstance(verify(impostor), Unauthentic)


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ([], "unsigned (no tailguard.signature header)"),
        ([("other", b"x")], "unsigned (no tailguard.signature header)"),
        (
            [(SIGNER_HEADER, b"failover"), (SIGNATURE_HEADER, b"00")],
            "incomplete signature: no tailguard.key-id header",
        ),
    ],
)
def test_unsigned_and_incomplete_records_are_unauthentic(headers: list, reason: str) -> None:
    assert verify(headers) == Unauthentic(reason)


def test_a_repeated_header_is_refused_even_if_one_copy_is_right() -> None:
    headers = [*signed(), (SIGNER_HEADER, b"decider")]
    assert verify(headers) == Unauthentic(f"repeated header {SIGNER_HEADER}")


def test_a_long_claimed_signer_is_cut_short_in_the_reason() -> None:
    headers = replaced(signed(), SIGNER_HEADER, b"x" * 10_000)
    result = verify(headers)
    assert isinstance(result, Unauthentic) and len(result.reason) < 200


def test_rotation_previous_keys_verify_and_the_current_key_signs() -> None:
    old, new = "o" * 40, "n" * 40
    before = Settings({KEY_SETTING: old})
    during = Settings({KEY_SETTING: new, PREVIOUS_KEYS_SETTING: old})
    after = Settings({KEY_SETTING: new})
    signed_before = signer_for(before, "failover").headers(TOPIC, VALUE)
    signed_during = signer_for(during, "failover").headers(TOPIC, VALUE)
    # During the rotation the agents take both, and the services already sign with the new key.
    assert isinstance(verifier_for(during).verify(TOPIC, VALUE, signed_before), Signed)
    assert isinstance(verifier_for(during).verify(TOPIC, VALUE, signed_during), Signed)
    assert signed_during != signed_before
    # Once the old key is dropped, what it signed no longer counts.
    assert isinstance(verifier_for(after).verify(TOPIC, VALUE, signed_before), Unauthentic)
    assert isinstance(verifier_for(before).verify(TOPIC, VALUE, signed_during), Unauthentic)


def test_without_a_key_nothing_is_signed_or_checked() -> None:
    assert isinstance(signer_for(Settings(), "decider"), NoSigning)
    assert signer_for(Settings(), "decider").headers(TOPIC, VALUE) == []
    assert isinstance(verifier_for(Settings()), NoVerification)
    assert verifier_for(Settings()).verify(TOPIC, VALUE, []) == Unchecked()
    # A key of only white space is no key.
    assert isinstance(verifier_for(Settings({KEY_SETTING: "   "})), NoVerification)


def test_a_short_key_is_refused_without_showing_it() -> None:
    with pytest.raises(ConfigError, match=f"{KEY_SETTING}: a signing key needs at least 32") as e:
        signer_for(Settings({KEY_SETTING: "hunter2-secret"}), "decider")
    assert "hunter2" not in str(e.value)
    with pytest.raises(ConfigError, match=PREVIOUS_KEYS_SETTING):
        verifier_for(Settings({KEY_SETTING: "k" * 32, PREVIOUS_KEYS_SETTING: "k" * 32 + ",short"}))


def test_previous_keys_without_a_current_key_are_refused() -> None:
    with pytest.raises(ConfigError, match=f"{PREVIOUS_KEYS_SETTING} is set but {KEY_SETTING}"):
        verifier_for(Settings({PREVIOUS_KEYS_SETTING: "p" * 32}))


def test_the_key_id_and_repr_reveal_nothing_of_the_secret() -> None:
    secret = "the-secret-value-0123456789abcdef"
    key = SigningKey.parse(secret, KEY_SETTING)
    assert secret not in repr(key) and secret not in key.key_id
    assert len(key.key_id) == 16 and key.key_id != SigningKey(b"x" * 32).key_id
    headers = RecordSigner(key, "decider").headers(TOPIC, VALUE)
    assert all(secret.encode() not in value for _, value in headers)


# --------------------------------------------------------------------------- the processor


class EchoCore:
    """Answers every input with a FailJob and a finding (whatever a real core would emit)."""

    def handle(self, record: r.Record) -> list[r.Record]:
        return [
            r.FailJob(job_id=record.job_id, ts=record.ts, id="failover-x", reason="echo"),
            r.SpeculativeAttemptWon(
                job_id=record.job_id,
                ts=record.ts,
                id="failover-y",
                vertex="v",
                subtask=0,
                attempt=1,
                host="h",
            ),
        ]

    def metrics(self) -> dict[str, float]:
        return {}


def processor(settings: Settings) -> Processor:
    definition = Service("failover", r.EVENTS_TOPIC, lambda _s: EchoCore())
    return Processor(definition, settings, CODEC)


def signed_tick(signer: str = "agent", topic: str = r.EVENTS_TOPIC) -> tuple[bytes, list]:
    tick = CODEC.encode(r.Tick(job_id="job", ts=1, id="job-e1"))
    return tick, list(RecordSigner(KEY, signer).headers(topic, tick))


def test_the_processor_signs_every_output_as_its_service() -> None:
    tick, headers = signed_tick()
    out = processor(Settings({KEY_SETTING: "k" * 32})).process(tick, 0, 0, b"job", headers)
    assert [o.topic for o in out] == [r.COMMANDS_TOPIC, r.FINDINGS_TOPIC]
    verifier = SignatureVerifier([KEY])
    for o in out:
        assert verifier.verify(o.topic, o.value, list(o.headers)) == Signed("failover", KEY.key_id)


def test_the_processor_sends_unsigned_without_a_key_and_never_signs_dead_letters() -> None:
    tick = CODEC.encode(r.Tick(job_id="job", ts=1, id="job-e1"))
    assert all(o.headers == [] for o in processor(Settings()).process(tick, 0, 0))
    (dead,) = processor(Settings({KEY_SETTING: "k" * 32})).process(b"not avro", 0, 7)
    assert dead.topic == r.EVENTS_TOPIC + ".dlq"
    assert SIGNATURE_HEADER not in {name for name, _ in dead.headers}


@pytest.mark.parametrize(
    ("signer", "topic", "why"),
    [
        (None, r.EVENTS_TOPIC, "unauthenticated: unsigned"),
        ("detector", r.EVENTS_TOPIC, "not permitted: tailguard.events is written by agent"),
        ("agent", r.FINDINGS_TOPIC, "unauthenticated: signature does not match"),
    ],
)
def test_with_signing_on_a_service_feeds_its_core_only_what_its_topics_writers_signed(
    signer: str | None, topic: str, why: str
) -> None:
    """A forged fact steers decisions as a forged command would: it is a dead letter, with the
    reason, and the core never sees it (EchoCore would answer it)."""
    tick, headers = signed_tick(signer or "agent", topic)
    service = processor(Settings({KEY_SETTING: "k" * 32}))
    (dead,) = service.process(tick, 0, 5, b"job", [] if signer is None else headers)
    assert dead.topic == r.EVENTS_TOPIC + ".dlq" and dead.key == b"job" and dead.value == tick
    assert why in dict(dead.headers)[HEADER_ERROR].decode()
    assert service.metrics.refused._value.get() == 1
    # Rebuilding reads the same record again: still not fed (nothing the core holds changes).
    service.replay(tick, 0, 5, [] if signer is None else headers)
    assert service.snapshot().records == ()


def test_a_service_takes_records_its_topics_writer_signed_and_everything_when_signing_is_off() -> (
    None
):
    tick, headers = signed_tick("agent")
    assert (
        len(processor(Settings({KEY_SETTING: "k" * 32})).process(tick, 0, 0, b"job", headers)) == 2
    )
    assert len(processor(Settings()).process(tick, 0, 0, b"job", [])) == 2
