"""The secured embedded broker: SASL_SSL with SCRAM-SHA-512, and the ACLs of docs/security.md.

`tailguard broker up --secure` starts Apache Kafka with one listener for clients, SASL_SSL:
TLS with a certificate made on the spot (broker/tls.py) and SCRAM-SHA-512 logins, one
principal per role (broker/acls.py). Kafka's StandardAuthorizer denies whatever no ACL
allows; `tailguard-admin` is the only super user. Everything lives under
`<work_dir>/kafka/secure/`, readable by the owner only:

- `ca.pem`: the CA clients trust (`kafka.ssl.ca.location`); `broker-keystore.pem`: the
  broker's key and certificate;
- `credentials/<principal>`: each principal's password, one file each, for
  `TAILGUARD_KAFKA_SASL_PASSWORD_FILE` (settings_file.py): a password is never in a settings
  file, an environment variable, a command line or a log.

The SCRAM credentials are written into the metadata log when the storage is formatted
(`kafka-storage format --add-scram`), through a Java argument file that only the owner can
read and that is deleted afterwards, so no password is ever on a process's command line.
The broker's own logins - to its controller (SASL PLAIN on a loopback listener: a KRaft
controller cannot check SCRAM, whose credentials live in the log it serves) and to itself - are
the admin's, in `server.properties` (owner only; Kafka logs such values as `[hidden]`).

A broker whose storage was formatted secured stays secured at every later start; one formatted
without security cannot be secured in place (`tailguard broker down --purge` first).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tailguard.broker.acls import ADMIN, principals
from tailguard.broker.tls import (
    BrokerTls,
    existing_broker_tls,
    make_broker_tls,
    write_owner_only,
)

SECURE_DIR = "secure"
CREDENTIALS_DIR = "credentials"
HOST_FILE = "certificate-host.json"
MECHANISM = "SCRAM-SHA-512"
PROTOCOL = "SASL_SSL"
PASSWORD_ENV = "TAILGUARD_KAFKA_SASL_PASSWORD_FILE"
USERNAME_ENV = "TAILGUARD_KAFKA_SASL_USERNAME"
_SCRAM_LOGIN = "org.apache.kafka.common.security.scram.ScramLoginModule"
_PLAIN_LOGIN = "org.apache.kafka.common.security.plain.PlainLoginModule"
# StandardAuthorizer: KRaft's authorizer, its ACLs kept in the metadata log.
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


class SecureBrokerError(RuntimeError):
    """The secured broker's material could not be made or used."""


@dataclass(frozen=True)
class SecureBroker:
    """The secured broker's material under `directory`."""

    directory: Path
    tls: BrokerTls

    def password_file(self, principal: str) -> Path:
        return self.directory / CREDENTIALS_DIR / principal

    def password(self, principal: str) -> str:
        try:
            return self.password_file(principal).read_text().strip()
        except FileNotFoundError:
            raise SecureBrokerError(
                f"no credential for {principal} in {self.directory / CREDENTIALS_DIR}"
            ) from None

    def settings(self, principal: str) -> dict[str, str]:
        """The `kafka.*` settings of a client logging in as `principal`, without its password
        (give that with `environment(principal)`, or `kafka.sasl.password`)."""
        return {
            "kafka.security.protocol": PROTOCOL,
            "kafka.sasl.mechanism": MECHANISM,
            "kafka.sasl.username": principal,
            "kafka.ssl.ca.location": str(self.tls.ca),
        }

    def environment(self, principal: str) -> dict[str, str]:
        """Environment variables that log a tailguard process in as `principal`."""
        return login_environment(self.directory / CREDENTIALS_DIR, principal)

    def librdkafka_config(self, principal: str) -> dict[str, str]:
        """A confluent-kafka client's security settings for `principal`, password included:
        for clients held in memory only (the broker's own admin client, a test's producer)."""
        config = {k.removeprefix("kafka."): v for k, v in self.settings(principal).items()}
        return {**config, "sasl.password": self.password(principal)}


def login_environment(credentials: Path, principal: str) -> dict[str, str]:
    """Environment variables that log a tailguard process in as `principal`, whose password is
    the file `credentials/<principal>` (this broker's `credentials/`, or a secrets mount laid
    out the same way): the username, and the file the password is read from."""
    path = credentials / principal
    if not path.is_file():
        raise SecureBrokerError(f"no password file for {principal}: {path} does not exist")
    return {USERNAME_ENV: principal, PASSWORD_ENV: str(path.resolve())}


def secure_dir(kafka_dir: Path) -> Path:
    return kafka_dir / SECURE_DIR


def existing(kafka_dir: Path) -> SecureBroker | None:
    """The secured broker's material, if the broker under `kafka_dir` was made secured."""
    directory = secure_dir(kafka_dir)
    tls = existing_broker_tls(directory)
    return SecureBroker(directory, tls) if tls is not None else None


def _private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)


def prepare(kafka_dir: Path, host: str) -> SecureBroker:
    """The secured broker's material for a broker advertising `host`: passwords made once, the
    certificate made again when the host changed (its clients must then trust the new CA)."""
    directory = secure_dir(kafka_dir)
    _private_dir(directory)
    credentials = directory / CREDENTIALS_DIR
    _private_dir(credentials)
    for principal in principals():
        path = credentials / principal
        if not path.exists():
            # Hex: no character that Kafka's `--add-scram` or JAAS syntax would need quoted.
            write_owner_only(path, secrets.token_hex(24), replace=False)
    tls = existing_broker_tls(directory)
    host_file = directory / HOST_FILE
    made_for = json.loads(host_file.read_text()) if host_file.exists() else None
    if tls is None or made_for != host:
        tls = make_broker_tls(directory, [host])
        host_file.write_text(json.dumps(host))
    return SecureBroker(directory, tls)


def _jaas(module: str, fields: Mapping[str, str]) -> str:
    return f"{module} required " + " ".join(f'{k}="{v}"' for k, v in fields.items()) + ";"


def server_settings(secure: SecureBroker) -> dict[str, str]:
    """The broker's settings beyond the plain broker's, for the listener names SASL_SSL (the
    clients') and CONTROLLER (loopback, SASL PLAIN as the admin)."""
    admin = secure.password(ADMIN)
    scram = _jaas(_SCRAM_LOGIN, {"username": ADMIN, "password": admin})
    plain = _jaas(_PLAIN_LOGIN, {"username": ADMIN, "password": admin, f"user_{ADMIN}": admin})
    return {
        "listener.security.protocol.map": f"{PROTOCOL}:{PROTOCOL},CONTROLLER:SASL_PLAINTEXT",
        "inter.broker.listener.name": PROTOCOL,
        "sasl.enabled.mechanisms": MECHANISM,
        "sasl.mechanism.inter.broker.protocol": MECHANISM,
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": scram,
        "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
        "sasl.mechanism.controller.protocol": "PLAIN",
        "listener.name.controller.plain.sasl.jaas.config": plain,
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(secure.tls.keystore),
        # The broker's own client (to itself) trusts the same CA as every other client.
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(secure.tls.ca),
        "authorizer.class.name": AUTHORIZER,
        "super.users": f"User:{ADMIN}",
        "allow.everyone.if.no.acl.found": "false",
    }


def scram_arguments(secure: SecureBroker) -> list[str]:
    """`kafka-storage format` arguments that create every principal's SCRAM credential."""
    arguments = []
    for principal in principals():
        password = secure.password(principal)
        arguments += ["--add-scram", f"{MECHANISM}=[name={principal},password={password}]"]
    return arguments


def write_argument_file(path: Path, arguments: list[str]) -> None:
    """A Java launcher argument file (`java @path`) holding `arguments`, owner-only: the
    passwords among them stay off the process's command line."""
    write_owner_only(path, "\n".join(json.dumps(argument) for argument in arguments) + "\n")
