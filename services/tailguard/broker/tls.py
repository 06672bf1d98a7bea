"""A certificate authority and the broker's certificate, made on the spot for the secured broker.

`tailguard broker up --secure` (broker/secure.py) needs TLS without a PKI to ask: it makes a
CA of its own (kept beside the broker's data, so a restart serves the same certificate and its
clients keep trusting it) and a certificate for the broker's address, signed by it. Kafka reads
both as PEM (`ssl.keystore.type=PEM`): the key is unencrypted PKCS#8, as Kafka takes it without
`ssl.key.password`, and readable by the owner only. Clients trust the CA file
(`kafka.ssl.ca.location`) and check the broker's name against the certificate, so it names the
advertised host (an IP address as an IP SAN, a name as a DNS SAN) and `localhost`.

EC P-256 keys: small and quick to make (an RSA key takes a second on this machine's 2 cores), and
both Java 17 and OpenSSL (librdkafka, Python's ssl) speak them.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

CA_FILE = "ca.pem"
# The broker's key and certificate chain in one file: Kafka's `ssl.keystore.location` for PEM.
KEYSTORE_FILE = "broker-keystore.pem"
CA_NAME = "tailguard embedded Kafka CA"
VALID_DAYS = 825  # the longest a TLS server certificate may be valid for most clients


# A CA signs certificates and revocation lists, and nothing else.
_CA_USAGE = dict.fromkeys(
    ("digital_signature", "content_commitment", "key_encipherment", "data_encipherment",
     "key_agreement", "encipher_only", "decipher_only"),
    False,
) | {"key_cert_sign": True, "crl_sign": True}  # fmt: skip


@dataclass(frozen=True)
class BrokerTls:
    ca: Path  # clients trust this
    keystore: Path  # the broker's key and certificate chain


def write_owner_only(path: Path, data: str | bytes, *, replace: bool = True) -> None:
    """Write `data` to `path`, readable by its owner only from the start (a key, a password, a
    settings file holding one); `replace=False`: fail if it exists."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if replace else os.O_EXCL)
    descriptor = os.open(path, flags, 0o600)
    with os.fdopen(descriptor, "wb") as out:
        out.write(data.encode() if isinstance(data, str) else data)
    path.chmod(0o600)  # a file from before, made with other permissions


def _subject_alt_names(hosts: list[str]) -> list[object]:
    from cryptography import x509

    names: list[object] = []
    for host in dict.fromkeys([*hosts, "localhost"]):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def make_broker_tls(directory: Path, hosts: list[str]) -> BrokerTls:
    """A new CA and a certificate for `hosts` signed by it, written under `directory`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    # A little in the past: a client whose clock is behind still accepts it.
    not_before, not_after = now - datetime.timedelta(hours=1), now + datetime.timedelta(VALID_DAYS)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_NAME)])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(**_CA_USAGE),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(_subject_alt_names(hosts)), critical=False)  # type: ignore[arg-type]
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    pem = serialization.Encoding.PEM
    ca = directory / CA_FILE
    ca.write_bytes(ca_cert.public_bytes(pem))
    keystore = directory / KEYSTORE_FILE
    write_owner_only(
        keystore,
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        + cert.public_bytes(pem)
        + ca_cert.public_bytes(pem),
    )
    # The CA's key is not kept: nothing signs with it again (a new address makes a new CA).
    return BrokerTls(ca, keystore)


def existing_broker_tls(directory: Path) -> BrokerTls | None:
    """The CA and keystore made by an earlier start, if both are there."""
    tls = BrokerTls(directory / CA_FILE, directory / KEYSTORE_FILE)
    return tls if tls.ca.is_file() and tls.keystore.is_file() else None
