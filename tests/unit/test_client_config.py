"""The Kafka client configurations built from settings, exactly, for PLAINTEXT, SASL_SSL/PLAIN,
SASL_SSL/SCRAM-SHA-512 and SSL with client certificates: the librdkafka dicts of every
librdkafka client, and the faust keyword arguments (with what aiokafka gets from them).

No secured Kafka broker runs here. What is real: librdkafka builds a client from each dict (it
loads the CA, certificate and key at that point, and refuses a wrong key password), and the TLS
contexts of both client kinds complete handshakes with a local TLS server that checks the client
certificate (certificates from trustme).
"""

from __future__ import annotations

import socket
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faust
import pytest
import trustme
from confluent_kafka import Consumer, Producer
from cryptography.hazmat.primitives import serialization
from faust.auth import GSSAPICredentials, SASLCredentials, SSLCredentials
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

from tailguard.kafka.config import (
    KAFKA_FETCH_WAIT_MS,
    client_config,
    configured_fetch_wait_ms,
    faust_app_options,
    faust_credentials,
    fetch_wait,
    is_embedded_cluster,
    security_settings,
)
from tailguard.kafka.producer import PRODUCER_DEFAULTS, producer_config
from tailguard.kafka.topic_reader import READER_DEFAULTS
from tailguard.kafka.topic_scan import read_only_config
from tailguard.model.config import ConfigError

BOOTSTRAP = "k1.example:9093,k2.example:9093"
KEY_PASSWORD = "key-pass-7d1e"


@dataclass
class Pki:
    """A CA, a server certificate for 127.0.0.1, and a client certificate with an encrypted key."""

    ca: trustme.CA
    ca_file: Path
    server: trustme.LeafCert
    cert_file: Path
    key_file: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    ca_file = root / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    client = ca.issue_cert("tailguard-service@example")
    cert_file, key_file = root / "client.pem", root / "client.key"
    client.cert_chain_pems[0].write_to_path(str(cert_file))
    key = serialization.load_pem_private_key(client.private_key_pem.bytes(), password=None)
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(KEY_PASSWORD.encode()),
        )
    )
    return Pki(ca, ca_file, ca.issue_cert("127.0.0.1", "localhost"), cert_file, key_file)


def scenarios(pki: Pki) -> dict[str, dict[str, str]]:
    """Each scenario's `kafka.*` settings, as a user writes them."""
    sasl_ssl = {"kafka.security.protocol": "SASL_SSL", "kafka.ssl.ca.location": str(pki.ca_file)}
    return {
        "PLAINTEXT": {},
        "SASL_SSL/PLAIN": {
            **sasl_ssl,
            "kafka.sasl.mechanism": "PLAIN",
            "kafka.sasl.username": "svc",
            "kafka.sasl.password": "pw-plain",
        },
        "SASL_SSL/SCRAM-SHA-512": {
            **sasl_ssl,
            "kafka.sasl.mechanisms": "SCRAM-SHA-512",
            "kafka.sasl.username": "svc",
            "kafka.sasl.password": "pw-scram",
        },
        "SSL/client-cert": {
            "kafka.security.protocol": "SSL",
            "kafka.ssl.ca.location": str(pki.ca_file),
            "kafka.ssl.certificate.location": str(pki.cert_file),
            "kafka.ssl.key.location": str(pki.key_file),
            "kafka.ssl.key.password": KEY_PASSWORD,
        },
    }


def settings_for(pki: Pki, scenario: str, **more: str) -> dict[str, str]:
    return {"bootstrap.servers": BOOTSTRAP, **scenarios(pki)[scenario], **more}


def librdkafka_security(pki: Pki, scenario: str) -> dict[str, str]:
    """What every librdkafka client must get on top of its own defaults: the settings verbatim."""
    return {k.removeprefix("kafka."): v for k, v in scenarios(pki)[scenario].items()}


SCENARIOS = ("PLAINTEXT", "SASL_SSL/PLAIN", "SASL_SSL/SCRAM-SHA-512", "SSL/client-cert")


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_librdkafka_client_gets_exactly_the_security_settings(
    pki: Pki, scenario: str
) -> None:
    settings = settings_for(pki, scenario)
    security = librdkafka_security(pki, scenario)
    base = {"bootstrap.servers": BOOTSTRAP}
    # The agent's producer (also the dead-letter producer).
    assert producer_config(settings) == {**base, **PRODUCER_DEFAULTS, **security}
    # The agent's consumer and the dead-letter reader (TopicReader's defaults).
    reader = {**READER_DEFAULTS, "group.id": "g", "auto.offset.reset": "earliest"}
    assert client_config(settings, "consumer", reader) == {**base, **reader, **security}
    # A service's state rebuild (and every read of a topic to its end).
    assert read_only_config(settings, "tailguard-decider") == {
        **base,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "allow.auto.create.topics": False,
        "log_level": 3,
        "group.id": "tailguard-decider",
        **security,
    }
    # Replay from topics (replay/inputs.py passes its own defaults the same way).
    replay = {"group.id": "tailguard-replay", "enable.auto.commit": False}
    assert client_config(settings, "consumer", replay) == {**base, **replay, **security}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_librdkafka_accepts_each_built_config(pki: Pki, scenario: str) -> None:
    # librdkafka validates every property, and with SSL loads the CA, certificate and key
    # (decrypting it with the password) when the client is created.
    settings = settings_for(pki, scenario)
    Producer(producer_config(settings))
    consumer = Consumer(read_only_config(settings, "g"))
    consumer.close()


def test_librdkafka_refuses_a_wrong_key_password(pki: Pki) -> None:
    settings = settings_for(pki, "SSL/client-cert", **{"kafka.ssl.key.password": "wrong"})
    with pytest.raises(Exception, match=r"ssl\.key"):
        Producer(producer_config(settings))


def test_role_settings_win_for_their_role_only(pki: Pki) -> None:
    settings = {
        "bootstrap.servers": BOOTSTRAP,
        "kafka.linger.ms": "5",
        "kafka.producer.linger.ms": "50",
        "kafka.consumer.fetch.wait.max.ms": "7",
    }
    assert producer_config(settings)["linger.ms"] == "50"
    assert "fetch.wait.max.ms" not in producer_config(settings)
    consumer = client_config(settings, "consumer", {"fetch.wait.max.ms": 5})
    assert consumer["linger.ms"] == "5" and consumer["fetch.wait.max.ms"] == "7"


# faust: the keyword arguments and what aiokafka gets from them.


def aiokafka_auth(options: dict[str, Any]) -> dict[str, Any]:
    return dict(credentials_to_aiokafka_auth(options["broker_credentials"]))


BROKER_URL = "kafka://k1.example:9093;kafka://k2.example:9093"


def test_faust_plaintext(pki: Pki) -> None:
    # Planted credentials do not switch the protocol, as with librdkafka.
    settings = settings_for(pki, "PLAINTEXT", **{"kafka.sasl.password": "unused"})
    options = faust_app_options(settings)
    assert options == {"broker": BROKER_URL, "broker_credentials": None}
    assert aiokafka_auth(options) == {"security_protocol": "PLAINTEXT"}


@pytest.mark.parametrize(
    ("scenario", "mechanism", "password"),
    [
        ("SASL_SSL/PLAIN", "PLAIN", "pw-plain"),
        ("SASL_SSL/SCRAM-SHA-512", "SCRAM-SHA-512", "pw-scram"),
    ],
)
def test_faust_sasl_ssl(pki: Pki, scenario: str, mechanism: str, password: str) -> None:
    options = faust_app_options(settings_for(pki, scenario))
    assert options["broker"] == BROKER_URL
    credentials = options["broker_credentials"]
    assert type(credentials) is SASLCredentials
    auth = aiokafka_auth(options)
    context = auth.pop("ssl_context")
    assert auth == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": mechanism,
        "sasl_plain_username": "svc",
        "sasl_plain_password": password,
    }
    assert_verifies_server(context, pki)
    assert password not in repr(credentials)


def test_faust_ssl_with_client_certificate(pki: Pki) -> None:
    options = faust_app_options(settings_for(pki, "SSL/client-cert"))
    assert type(options["broker_credentials"]) is SSLCredentials
    auth = aiokafka_auth(options)
    context = auth.pop("ssl_context")
    assert auth == {"security_protocol": "SSL"}
    assert_verifies_server(context, pki)
    # The server requires a client certificate from the CA: the key was loaded and decrypted.
    with tls_server(pki, require_client_cert=True) as server:
        handshake(context, server.port)
        assert server.wait_for_client() == "tailguard-service@example"


def test_faust_sasl_plaintext_has_no_tls(pki: Pki) -> None:
    credentials = faust_credentials(
        {"security.protocol": "sasl_plaintext", "sasl.mechanism": "SCRAM-SHA-256",
         "sasl.username": "u", "sasl.password": "p", "ssl.ca.location": "/nonexistent"}
    )  # fmt: skip
    assert credentials_to_aiokafka_auth(credentials) == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_plain_username": "u",
        "sasl_plain_password": "p",
        "ssl_context": None,
    }


def test_faust_gssapi_takes_the_service_name() -> None:
    credentials = faust_credentials(
        {"security.protocol": "SASL_PLAINTEXT", "sasl.kerberos.service.name": "kafka-prod"}
    )
    assert type(credentials) is GSSAPICredentials  # librdkafka's default mechanism
    assert credentials_to_aiokafka_auth(credentials) == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "GSSAPI",
        "sasl_kerberos_service_name": "kafka-prod",
        "sasl_kerberos_domain_name": None,
        "ssl_context": None,
    }


def test_faust_verification_switches(pki: Pki) -> None:
    base = {"security.protocol": "SSL", "ssl.ca.location": str(pki.ca_file)}
    no_hostname = faust_credentials({**base, "ssl.endpoint.identification.algorithm": "none"})
    assert isinstance(no_hostname, SSLCredentials)
    assert not no_hostname.context.check_hostname
    assert no_hostname.context.verify_mode == ssl.CERT_REQUIRED
    unverified = faust_credentials({**base, "enable.ssl.certificate.verification": "false"})
    assert isinstance(unverified, SSLCredentials)
    assert unverified.context.verify_mode == ssl.CERT_NONE


def test_build_app_hands_the_credentials_to_faust(pki: Pki, tmp_path: Path) -> None:
    from tailguard.codec import codec_for
    from tailguard.model.config import Settings
    from tailguard.shell.processor import Processor
    from tailguard.shell.worker import ServiceState, build_app
    from tailguard.system.services import service_named

    settings = Settings(settings_for(pki, "SASL_SSL/SCRAM-SHA-512"))
    definition = service_named("decider")
    options = faust_app_options(settings)
    processor = Processor(definition, settings, codec_for(settings))
    app = build_app(definition, options, processor, ServiceState(), tmp_path)
    assert isinstance(app, faust.App)
    assert app.conf.broker_credentials is options["broker_credentials"]
    assert [str(u) for u in app.conf.broker] == BROKER_URL.split(";")


# Combinations faust cannot do fail with an error naming the setting.


@pytest.mark.parametrize(
    ("security", "named"),
    [
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"}, "OAUTHBEARER"),
        (
            {"security.protocol": "SASL_SSL", "sasl.kerberos.keytab": "/etc/krb5.keytab"},
            "kafka.sasl.kerberos.keytab",
        ),
        ({"security.protocol": "SSL", "ssl.keystore.location": "a.p12"}, "kafka.ssl.keystore"),
        ({"security.protocol": "SSL", "ssl.key.pem": "-----BEGIN"}, "kafka.ssl.key.pem"),
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}, "kafka.sasl.username"),
        ({"security.protocol": "TLS"}, "kafka.security.protocol"),
        ({"security.protocol": "SSL", "ssl.key.location": "k.pem"}, "ssl.certificate.location"),
        (
            {
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "PLAIN",
                "sasl.mechanisms": "SCRAM-SHA-256",
                "sasl.username": "u",
                "sasl.password": "p",
            },
            "kafka.sasl.mechanisms",
        ),
    ],
)
def test_what_faust_cannot_do_is_refused(security: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        faust_credentials(security)


def test_a_wrong_key_password_is_named_but_not_shown(pki: Pki) -> None:
    settings = settings_for(pki, "SSL/client-cert", **{"kafka.ssl.key.password": "wrong-8c2f"})
    with pytest.raises(ConfigError, match=r"ssl\.key\.password") as caught:
        faust_app_options(settings)
    assert "wrong-8c2f" not in str(caught.value)


def test_producer_and_consumer_credentials_must_agree_for_faust() -> None:
    settings = {
        "kafka.security.protocol": "SASL_PLAINTEXT",
        "kafka.producer.sasl.username": "writer",
        "kafka.consumer.sasl.username": "reader",
    }
    with pytest.raises(ConfigError, match=r"sasl\.username"):
        security_settings(settings)
    same = {**settings, "kafka.consumer.sasl.username": "writer"}
    assert security_settings(same) == {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.username": "writer",
    }


# A local TLS endpoint, to check the built contexts against a real handshake.


@dataclass
class TlsServer:
    port: int
    clients: list[str]
    seen: threading.Event

    def wait_for_client(self, timeout: float = 10.0) -> str:
        assert self.seen.wait(timeout), "no TLS client completed a handshake"
        return self.clients[0]


class tls_server:
    def __init__(self, pki: Pki, *, require_client_cert: bool, leaf: Any = None) -> None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        (leaf or pki.server).configure_cert(context)
        if require_client_cert:
            pki.ca.configure_trust(context)
            context.verify_mode = ssl.CERT_REQUIRED
        self._context = context
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.server = TlsServer(self._listener.getsockname()[1], [], threading.Event())
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while True:
            try:
                raw, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                with self._context.wrap_socket(raw, server_side=True) as conn:
                    cert = conn.getpeercert() or {}
                    names = [v for part in cert.get("subjectAltName", ()) for v in part[1:]]
                    self.server.clients.append(names[0] if names else "")
                    self.server.seen.set()
            except (ssl.SSLError, OSError):
                raw.close()

    def __enter__(self) -> TlsServer:
        self._thread.start()
        return self.server

    def __exit__(self, *exc: object) -> None:
        # shutdown wakes the blocked accept(); close alone would not.
        self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._thread.join(5)


def handshake(context: ssl.SSLContext, port: int) -> None:
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1"),
    ):
        pass


def assert_verifies_server(context: ssl.SSLContext, pki: Pki) -> None:
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    with tls_server(pki, require_client_cert=False) as server:
        handshake(context, server.port)
    # Control: a server whose certificate comes from another CA is refused.
    stranger = trustme.CA().issue_cert("127.0.0.1")
    with (
        tls_server(pki, require_client_cert=False, leaf=stranger) as server,
        pytest.raises(ssl.SSLCertVerificationError),
    ):
        handshake(context, server.port)


def test_librdkafka_presents_the_client_certificate(pki: Pki) -> None:
    # librdkafka's TLS handshake with the built SSL config; the server checks the certificate
    # (the Kafka protocol after it is not answered: there is no broker here).
    with tls_server(pki, require_client_cert=True) as server:
        settings = settings_for(pki, "SSL/client-cert")
        settings["bootstrap.servers"] = f"127.0.0.1:{server.port}"
        # librdkafka connects to a bootstrap broker for metadata as soon as it starts.
        producer = Producer({**producer_config(settings), "log_level": 0})
        assert server.wait_for_client() == "tailguard-service@example"
        del producer


# The fetch wait: what the settings say, else by the broker that answered.


def test_the_fetch_wait_is_short_on_the_embedded_broker_and_kafkas_own_on_kafka() -> None:
    assert is_embedded_cluster("mockCluster1f2e3d")
    assert not is_embedded_cluster("lkc-7Hn2uXQwT3yLb0aZ1c9rKg") and not is_embedded_cluster(None)
    assert fetch_wait({}, "mockCluster1f2e3d", 20).ms == 20
    assert fetch_wait({}, "7Hn2uXQwT3yLb0aZ1c9rKg", 20).ms == KAFKA_FETCH_WAIT_MS == 500
    # Not reached yet: the short wait, which costs only idle requests if it is Kafka after all.
    assert fetch_wait({}, None, 20).ms == 20
    for key in ("kafka.consumer.fetch.wait.max.ms", "kafka.fetch.wait.max.ms"):
        assert fetch_wait({key: " 7 "}, "mockCluster1", 20).ms == 7
        assert fetch_wait({key: "0"}, "7Hn2uXQwT3yLb0aZ1c9rKg", 20).ms == 0
    assert configured_fetch_wait_ms({}) is None


@pytest.mark.parametrize("value", ["fast", "-1", "2.5"])
def test_a_bad_fetch_wait_is_refused_naming_the_setting(value: str) -> None:
    with pytest.raises(ConfigError, match=r"kafka\.consumer\.fetch\.wait\.max\.ms.*" + value):
        fetch_wait({"kafka.consumer.fetch.wait.max.ms": value}, None, 20)


def test_the_fetch_wait_says_why() -> None:
    assert fetch_wait({}, "mockCluster1", 20).why == "cluster mockCluster1 is the mock broker"
    assert (
        fetch_wait({}, "7Hn2uXQwT3yLb0aZ1c9rKg", 20).why
        == "cluster 7Hn2uXQwT3yLb0aZ1c9rKg is Kafka"
    )
    assert fetch_wait({}, None, 20).why.startswith("no broker answered yet")
    assert fetch_wait({"kafka.fetch.wait.max.ms": "7"}, None, 20) == (
        7,
        "kafka.consumer.fetch.wait.max.ms is set",
    )
