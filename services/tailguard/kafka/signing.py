"""Signed records: who put a record on the log, checked with a shared key (HMAC-SHA256).

The sender of a record signs it; the signature travels in three Kafka headers beside the value,
which stays exactly as it was (the Avro contract does not change, and a reader that does not
check signatures sees nothing new):

    tailguard.signer     who signed: a service's name, or `agent` (UTF-8)
    tailguard.key-id     which key: the key's fingerprint (see `SigningKey.key_id`)
    tailguard.signature  HMAC-SHA256, hex, over the version tag, the topic, the signer, the key
                         id and the value, each length-prefixed

The topic is signed so that a signed record cannot be replayed onto another topic; the signer
and key id so that the headers cannot be swapped. The job id is inside the value, so a record
signed for one job means nothing to another.

Keys come from settings: `security.command-signing.key` signs and verifies;
`security.command-signing.previous-keys` (comma-separated) verify only, so a key can be rotated
without a moment when the agents and the services disagree (docs/security.md gives the steps).
A key is named by its fingerprint rather than by a configured id: no setting can pair an id with
the wrong key, and the verifier picks the key without trying each.

Standard library only: the services, the agent, replay and the tests share it.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from tailguard.model.authority import Signed, Unauthentic, Unchecked, shown
from tailguard.model.config import ConfigError

KEY_SETTING = "security.command-signing.key"
PREVIOUS_KEYS_SETTING = "security.command-signing.previous-keys"

SIGNER_HEADER = "tailguard.signer"
KEY_ID_HEADER = "tailguard.key-id"
SIGNATURE_HEADER = "tailguard.signature"
_HEADERS = (SIGNER_HEADER, KEY_ID_HEADER, SIGNATURE_HEADER)

# HMAC-SHA256 takes a key of any length, but one shorter than the hash output is weaker than the
# hash; 32 bytes is what `secrets.token_urlsafe(32)` (43 characters) gives.
MIN_KEY_BYTES = 32
# Bumped if the signed message ever changes, so an old signature can never verify under new rules.
_VERSION = b"tailguard-signature-v1"

# Message headers as confluent-kafka gives them (values may be None) and takes them.
ReceivedHeaders = Sequence[tuple[str, bytes | str | None]]
Headers = list[tuple[str, bytes]]


@dataclass(frozen=True)
class SigningKey:
    """A shared secret; its repr shows only the key id."""

    secret: bytes = field(repr=False)

    @functools.cached_property
    def key_id(self) -> str:
        # Computed once: every signature and every check names the key (two SHA-256 runs a
        # signed record otherwise, ~1 µs each, beside the HMAC's ~5 µs).
        # Domain-separated, so the id is no HMAC or hash that appears anywhere else; 64 bits
        # tell a handful of keys apart, and say nothing useful about a random key.
        return hashlib.sha256(b"tailguard key id\x00" + self.secret).hexdigest()[:16]

    @classmethod
    def parse(cls, text: str, setting: str) -> SigningKey:
        """A key as written in settings (its UTF-8 bytes), at least `MIN_KEY_BYTES` long. The
        error names the setting and the length, never the value."""
        secret = text.strip().encode()
        if len(secret) < MIN_KEY_BYTES:
            raise ConfigError(
                f"{setting}: a signing key needs at least {MIN_KEY_BYTES} bytes, this one has "
                f"{len(secret)} (make one with: python -c "
                f"'import secrets; print(secrets.token_urlsafe(32))')"
            )
        return cls(secret)


def _field(value: bytes) -> bytes:
    return struct.pack(">I", len(value)) + value


def signature(key: SigningKey, topic: str, signer: str, value: bytes) -> str:
    """The hex HMAC-SHA256 of a record's bytes on `topic`, signed by `signer` with `key`."""
    message = b"".join(
        _field(part)
        for part in (_VERSION, topic.encode(), signer.encode(), key.key_id.encode(), value)
    )
    return hmac.new(key.secret, message, hashlib.sha256).hexdigest()


class RecordSigner:
    """Signs what one sender (a service, or the agent) publishes."""

    def __init__(self, key: SigningKey, signer: str) -> None:
        self.key = key
        self.signer = signer

    def headers(self, topic: str, value: bytes) -> Headers:
        return [
            (SIGNER_HEADER, self.signer.encode()),
            (KEY_ID_HEADER, self.key.key_id.encode()),
            (SIGNATURE_HEADER, signature(self.key, topic, self.signer, value).encode()),
        ]


class NoSigning:
    """Stands in for the signer when no key is configured: records go out unsigned."""

    def headers(self, topic: str, value: bytes) -> Headers:
        return []


class SignatureVerifier:
    """Checks a received record's signature against the configured keys."""

    def __init__(self, keys: Iterable[SigningKey]) -> None:
        self._keys = {key.key_id: key for key in keys}
        if not self._keys:
            raise ValueError("a verifier needs at least one key")

    def verify(self, topic: str, value: bytes, headers: ReceivedHeaders) -> Signed | Unauthentic:
        found: dict[str, list[bytes]] = {}
        for name, raw in headers:
            if name in _HEADERS:
                data = raw.encode() if isinstance(raw, str) else (raw or b"")
                found.setdefault(name, []).append(data)
        if not found:
            return Unauthentic("unsigned (no tailguard.signature header)")
        missing = [name for name in _HEADERS if name not in found]
        if missing:
            return Unauthentic(f"incomplete signature: no {', '.join(missing)} header")
        repeated = [name for name, values in found.items() if len(values) > 1]
        if repeated:
            # Which of two would count is not for the sender to choose.
            return Unauthentic(f"repeated header {', '.join(sorted(repeated))}")
        try:
            signer = found[SIGNER_HEADER][0].decode()
            key_id = found[KEY_ID_HEADER][0].decode()
        except UnicodeDecodeError:
            return Unauthentic("signer or key id is not UTF-8")
        key = self._keys.get(key_id)
        if key is None:
            return Unauthentic(f"signed with an unknown key (id {shown(key_id)})")
        expected = signature(key, topic, signer, value).encode()
        if not hmac.compare_digest(expected, found[SIGNATURE_HEADER][0]):
            return Unauthentic(
                f"signature does not match (claims signer {shown(signer)}, key {key_id})"
            )
        return Signed(signer, key_id)


class NoVerification:
    """Stands in for the verifier when no key is configured: every record is `Unchecked`."""

    def verify(self, topic: str, value: bytes, headers: ReceivedHeaders) -> Unchecked:
        return Unchecked()


def signing_keys(settings: Mapping[str, str]) -> tuple[SigningKey | None, list[SigningKey]]:
    """The current key (None: signing is off) and the keys accepted for verification only."""
    text = settings.get(KEY_SETTING, "").strip()
    current = SigningKey.parse(text, KEY_SETTING) if text else None
    previous = [
        SigningKey.parse(part, PREVIOUS_KEYS_SETTING)
        for part in settings.get(PREVIOUS_KEYS_SETTING, "").split(",")
        if part.strip()
    ]
    if previous and current is None:
        raise ConfigError(
            f"{PREVIOUS_KEYS_SETTING} is set but {KEY_SETTING} is not: with no current key "
            f"nothing is signed or verified"
        )
    return current, previous


def signer_for(settings: Mapping[str, str], name: str) -> RecordSigner | NoSigning:
    """What signs the records `name` sends, from settings."""
    current, _ = signing_keys(settings)
    return NoSigning() if current is None else RecordSigner(current, name)


def verifier_for(settings: Mapping[str, str]) -> SignatureVerifier | NoVerification:
    """What checks received records, from settings: the current key and the previous ones."""
    current, previous = signing_keys(settings)
    return NoVerification() if current is None else SignatureVerifier([current, *previous])
