"""The secured broker's parts that need no broker (seconds): the ACL table against
docs/security.md, the certificate against a real TLS handshake, and the server settings and
format arguments `tailguard broker up --secure` uses (tests/integration/test_secure_kafka.py
runs them on Kafka: make test-secure-kafka)."""

from __future__ import annotations

import contextlib
import re
import socket
import ssl
import stat
import threading
from pathlib import Path

import pytest

from tailguard.broker import secure as kafka_secure
from tailguard.broker.acls import (
    ADMIN,
    AGENT,
    AUDITOR,
    SERVICE_TOPICS,
    acl_commands,
    declared_acls,
    principals,
    service_principal,
)
from tailguard.broker.tls import make_broker_tls
from tailguard.kafka.config import ssl_context

SECURITY_DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"
ROLES = ("agent", *SERVICE_TOPICS, "auditors")


def _principal(role: str) -> str:
    return {"agent": AGENT, "auditors": AUDITOR}.get(role) or service_principal(role)


def documented_topic_acls() -> set[tuple[str, str, str]]:
    """(principal, "Write"/"Read", topic) from the table under docs/security.md's "Kafka ACLs"."""
    section = SECURITY_DOC.read_text().split("## Kafka ACLs", 1)[1].split("\n## ", 1)[0]
    rows: set[tuple[str, str, str]] = set()
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`tailguard."):
            continue
        topic = cells[0].strip("`")
        for operation, cell in (("Write", cells[1]), ("Read", cells[2])):
            # A parenthesis says why, and may name other roles ("the speculator's input").
            said = re.sub(r"\([^)]*\)", "", cell)
            for role in re.findall(r"[a-z]+", said):
                assert role in ROLES, f"docs/security.md names {role!r} for {topic}"
                rows.add((_principal(role), operation, topic))
    return rows


def test_the_declared_topic_acls_are_the_documented_ones() -> None:
    declared = {
        (acl.principal, acl.operation, acl.name)
        for acl in declared_acls()
        if acl.resource == "topic"
    }
    assert declared == documented_topic_acls()


def test_only_the_admin_is_a_super_user_and_every_other_principal_has_acls() -> None:
    with_acls = {acl.principal for acl in declared_acls()}
    assert set(principals()) - with_acls == {ADMIN}
    assert len(set(principals())) == len(principals()) == 8
    # Each service may read its own consumer group (and its probe), and no one else's.
    groups = {(a.principal, a.name) for a in declared_acls() if a.resource == "group"}
    for service in SERVICE_TOPICS:
        assert (service_principal(service), service_principal(service)) in groups
    assert "--add --allow-principal User:tailguard-agent --operation Write --topic " \
        "tailguard.events" in acl_commands()  # fmt: skip


def test_the_broker_certificate_passes_a_tls_handshake_with_the_clients_settings(
    tmp_path: Path,
) -> None:
    tls = make_broker_tls(tmp_path, ["127.0.0.1"])
    assert stat.S_IMODE(tls.keystore.stat().st_mode) == 0o600
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tls.keystore)
    # What the services' faust client builds from the same settings (hostname checked).
    client = ssl_context({"ssl.ca.location": str(tls.ca)})
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def serve() -> None:
            connection, _ = listener.accept()
            with server.wrap_socket(connection, server_side=True) as tls_connection:
                tls_connection.sendall(b"ok")

        thread = threading.Thread(target=serve)
        thread.start()
        with (
            socket.create_connection(("127.0.0.1", port)) as raw,
            client.wrap_socket(raw, server_hostname="127.0.0.1") as tls_connection,
        ):
            assert tls_connection.recv(2) == b"ok"
        thread.join(5)
        # Another name is refused: the certificate is the broker's address only.
        with socket.create_connection(("127.0.0.1", port)) as raw:
            thread = threading.Thread(target=lambda: _accept_quietly(listener, server))
            thread.start()
            with pytest.raises(ssl.SSLCertVerificationError):
                client.wrap_socket(raw, server_hostname="broker.example.com")
            thread.join(5)


def _accept_quietly(listener: socket.socket, server: ssl.SSLContext) -> None:
    connection, _ = listener.accept()
    # The client hangs up on the certificate, as it should.
    with contextlib.suppress(ssl.SSLError, OSError):
        server.wrap_socket(connection, server_side=True).close()


def test_passwords_stay_in_owner_only_files_and_off_the_client_settings(tmp_path: Path) -> None:
    secured = kafka_secure.prepare(tmp_path, "127.0.0.1")
    passwords = {p: secured.password(p) for p in principals()}
    assert len(set(passwords.values())) == len(passwords)
    for principal in principals():
        path = secured.password_file(principal)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert passwords[principal] not in repr(secured.settings(principal))
        assert secured.environment(principal)["TAILGUARD_KAFKA_SASL_PASSWORD_FILE"] == str(path)
    # A second start keeps the passwords (they are in the broker's metadata log) and the CA.
    ca = secured.tls.ca.read_bytes()
    again = kafka_secure.prepare(tmp_path, "127.0.0.1")
    assert {p: again.password(p) for p in principals()} == passwords
    assert again.tls.ca.read_bytes() == ca
    # A new address needs a new certificate (the passwords stay).
    moved = kafka_secure.prepare(tmp_path, "10.0.0.7")
    assert moved.tls.ca.read_bytes() != ca
    assert moved.password(ADMIN) == passwords[ADMIN]


def test_the_server_settings_and_the_format_arguments(tmp_path: Path) -> None:
    secured = kafka_secure.prepare(tmp_path, "127.0.0.1")
    settings = kafka_secure.server_settings(secured)
    assert settings["super.users"] == f"User:{ADMIN}"
    assert settings["allow.everyone.if.no.acl.found"] == "false"
    assert settings["authorizer.class.name"].endswith("StandardAuthorizer")
    arguments = kafka_secure.scram_arguments(secured)
    assert arguments[0::2] == ["--add-scram"] * len(principals())
    assert arguments[1] == (f"SCRAM-SHA-512=[name={ADMIN},password={secured.password(ADMIN)}]")
    argument_file = tmp_path / "format.args"
    kafka_secure.write_argument_file(argument_file, ["a b", *arguments])
    assert stat.S_IMODE(argument_file.stat().st_mode) == 0o600
    assert argument_file.read_text().splitlines()[0] == '"a b"'


def test_each_service_may_read_its_input_and_write_its_outputs_and_nothing_else() -> None:
    from tailguard.system.services import SERVICES

    assert set(SERVICE_TOPICS) == {s.name for s in SERVICES}
    for service in SERVICES:
        source, outputs = SERVICE_TOPICS[service.name]
        assert source == service.input_topic, service.name
        assert set(outputs) == {t.TOPIC for t in service.outputs}, service.name


def test_services_up_with_logins_names_a_missing_password_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    from tailguard.shell import services_cli

    parser = argparse.ArgumentParser()
    services_cli.add_arguments(parser)
    config = tmp_path / "tailguard.toml"
    config.write_text(f'"tailguard.work-dir" = "{tmp_path / "work"}"\n')
    args = parser.parse_args(["up", "--logins", str(tmp_path / "none"), "--only", "decider"])
    args.config = str(config)
    assert services_cli.run(args) == 1
    assert f"{tmp_path / 'none' / 'tailguard-decider'} does not exist" in capsys.readouterr().err
    assert not (tmp_path / "work" / "services").exists()  # nothing was started
