"""The embedded broker's real form: one Apache Kafka node in KRaft combined mode.

Everything lives under `<work_dir>/kafka/`: the broker's settings file, the address it was
given (`address.json`) and its data (`data/`, formatted with Kafka's `StorageTool` on the first
start). A later start - after `broker down`, a kill -9 or a reboot - runs on the same data and
the same address, so the log is kept and every client of the broker before reconnects by
itself. `purge()` deletes the directory.

The JVM runs with a 512 MiB heap cap (Kafka's scripts default to 1 GiB): on the 2-core,
24 GiB development machine the broker shares the memory with a Spark cluster and its Python
workers, and a one-node broker carrying tailguard's records - a few MB a minute - peaks far below
it (its resident size after the demo is in docs/log.md). The serial collector keeps the JVM's GC
threads off the other process's two cores.

Readiness is Kafka answering a metadata request from confluent-kafka's AdminClient; each wait
is librdkafka's own (no sleep), and the process's exit ends the wait at once.
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from tailguard.broker import secure as kafka_secure
from tailguard.broker.acls import Acl
from tailguard.broker.kafka_jars import kafka_classpath
from tailguard.broker.secure import (
    PROTOCOL,
    SecureBroker,
    scram_arguments,
    server_settings,
    write_argument_file,
)
from tailguard.broker.tls import write_owner_only
from tailguard.jdk import java_path
from tailguard.kafka.broker_state import KAFKA_MAIN_CLASS, KAFKA_PROPERTIES_FILE
from tailguard.kafka.topics import TopicSpec, declared_topics
from tailguard.model.durations import seconds_text
from tailguard.processes import supervised

KAFKA_DIR = "kafka"
DATA_DIR = "data"
ADDRESS_FILE = "address.json"
# The broker process is recognised by this file name on its command line (broker_state).
PROPERTIES_FILE = KAFKA_PROPERTIES_FILE
LOG4J_FILE = "log4j2.properties"
MAIN_CLASS = KAFKA_MAIN_CLASS
# C1 only (no C2): the embedded broker carries a control plane's traffic, and C2 kept
# recompiling its request paths for minutes on the cores the jobs use, which cost more CPU and a
# p99 latency 8x C1's (figures: docs/log.md, "Its compiler"). A deployment's own Kafka is not this.
JVM_OPTIONS = (
    "-Xms64m",
    "-Xmx512m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)
DEFAULT_HOST = "127.0.0.1"
# The broker's INFO lines for each topic and segment would fill broker.log during a test run;
# warnings, errors and its start/stop lines remain.
_LOG4J = """status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.out.ref = OUT
logger.server.name = kafka.server.KafkaRaftServer
logger.server.level = INFO
logger.kafka.name = kafka.Kafka$
logger.kafka.level = INFO
"""


class KafkaServerError(RuntimeError):
    """The Kafka broker could not be configured, started or reached."""


Report = Callable[[str], None]


@dataclass(frozen=True)
class Address:
    """Where the broker listens: `host:port` for clients (and advertised as such), and a
    loopback port for its own KRaft controller."""

    host: str
    port: int
    controller_port: int

    @property
    def advertised_host(self) -> str:
        # A wildcard is no address a client can connect to: advertise the machine's name.
        return socket.getfqdn() if self.host in ("0.0.0.0", "") else self.host

    @property
    def bootstrap(self) -> str:
        return f"{self.advertised_host}:{self.port}"


def kafka_dir(work_dir: Path) -> Path:
    return work_dir / KAFKA_DIR


def purge(work_dir: Path) -> bool:
    """Delete the broker's data and settings; whether there were any."""
    directory = kafka_dir(work_dir)
    if not directory.exists():
        return False
    shutil.rmtree(directory)
    return True


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def parse_listen(listen: str) -> tuple[str, int]:
    """`HOST:PORT` (PORT 0: any free port) as (host, port); a ValueError says what is wrong."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"expected HOST:PORT (such as 127.0.0.1:9092), got {listen!r}")
    return host, int(port)


def address_for(work_dir: Path, listen: str | None) -> Address:
    """The address recorded by an earlier start (so clients find the broker again), unless
    `listen` asks for another; a new address is recorded."""
    path = kafka_dir(work_dir) / ADDRESS_FILE
    recorded: Address | None = None
    if path.exists():
        recorded = Address(**json.loads(path.read_text()))
    if listen is None and recorded is not None:
        return recorded
    host, port = parse_listen(listen or f"{DEFAULT_HOST}:0")
    if recorded is not None and recorded.host == host and port in (0, recorded.port):
        return recorded
    address = Address(host, port or _free_port(host), _free_port(DEFAULT_HOST))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(address)))
    return address


def server_properties(address: Address, data_dir: Path, secure: SecureBroker | None = None) -> str:
    """The broker's settings: a PLAINTEXT listener for clients, or with `secure` a SASL_SSL one
    (broker/secure.py)."""
    listen_host = "" if address.host == "0.0.0.0" else address.host
    client = PROTOCOL if secure is not None else "PLAINTEXT"
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@{DEFAULT_HOST}:{address.controller_port}",
        "controller.listener.names": "CONTROLLER",
        "listeners": (
            f"{client}://{listen_host}:{address.port},"
            f"CONTROLLER://{DEFAULT_HOST}:{address.controller_port}"
        ),
        "advertised.listeners": f"{client}://{address.bootstrap}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(data_dir),
        # One node: every internal topic has one replica.
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "8",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "num.partitions": "4",
        "auto.create.topics.enable": "true",
        # A consumer group's first member should not wait 3 s for others that never come.
        "group.initial.rebalance.delay.ms": "0",
        **(server_settings(secure) if secure is not None else {}),
    }
    return "".join(f"{key}={value}\n" for key, value in settings.items())


def _java() -> str:
    found = java_path()
    if found is None:
        raise KafkaServerError(
            "`java` not found: Apache Kafka's broker needs a JDK 17 (the one Spark needs), on "
            "PATH or via JAVA_HOME"
        )
    return found


def _cluster_id() -> str:
    """A new cluster id as Kafka writes them: a UUID in URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def launch(
    work_dir: Path, listen: str | None, log_path: Path, report: Report, *, secure: bool = False
) -> tuple[subprocess.Popen[bytes], Address, SecureBroker | None]:
    """Start the broker process detached, its output appended to `log_path` (formatting its
    storage first if new); not yet ready. With
    `secure`, or if its storage was formatted secured, it is the secured broker
    (broker/secure.py), whose material comes back too."""
    libs = kafka_classpath(report)
    java = _java()
    directory = kafka_dir(work_dir).resolve()
    data = directory / DATA_DIR
    formatted = (data / "meta.properties").exists()
    if secure and formatted and kafka_secure.existing(directory) is None:
        raise KafkaServerError(
            f"the broker's data in {data} was made without security and cannot be secured in "
            "place: `tailguard broker down --purge` deletes it, then `broker up --secure`"
        )
    address = address_for(work_dir, listen)
    material: SecureBroker | None = None
    if secure or kafka_secure.existing(directory) is not None:
        material = kafka_secure.prepare(directory, address.advertised_host)
    properties = directory / PROPERTIES_FILE
    # Owner-only: a secured broker's settings hold the admin's password.
    write_owner_only(properties, server_properties(address, data, material))
    (directory / LOG4J_FILE).write_text(_LOG4J)
    classpath = ["-cp", f"{libs}/*", f"-Dlog4j2.configurationFile={directory / LOG4J_FILE}"]
    if not formatted:
        report(f"formatting the broker's storage in {data}")
        with log_path.open("ab") as log:
            _format(java, classpath, properties, material, log)
    process = supervised.launch(
        [java, *JVM_OPTIONS, *classpath, MAIN_CLASS, str(properties)], log_path, cwd=directory
    )
    return process, address, material


def _format(
    java: str,
    classpath: list[str],
    properties: Path,
    secure: SecureBroker | None,
    log: IO[bytes],
) -> None:
    """Format the storage with Kafka's StorageTool; a secured broker's SCRAM credentials go
    into the metadata log then, passed in an owner-only argument file deleted afterwards."""
    # `--cluster-id=`: an id may start with "-" (URL-safe base64), which as an argument of its
    # own reads as an option.
    arguments = [
        "kafka.tools.StorageTool", "format", f"--cluster-id={_cluster_id()}", "-c", str(properties)
    ]  # fmt: skip
    if secure is None:
        command = [java, *JVM_OPTIONS, *classpath, *arguments]
        formatted = subprocess.run(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, check=False
        )
    else:
        argument_file = secure.directory / "format.args"
        write_argument_file(argument_file, [*arguments, *scram_arguments(secure)])
        try:
            command = [java, *JVM_OPTIONS, *classpath, f"@{argument_file}"]
            formatted = subprocess.run(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, check=False
            )
        finally:
            argument_file.unlink(missing_ok=True)
    if formatted.returncode != 0:
        raise KafkaServerError(
            f"formatting the broker's storage failed (exit {formatted.returncode}); see "
            f"{getattr(log, 'name', 'the broker log')}"
        )


def await_ready(
    bootstrap: str,
    process: subprocess.Popen[bytes],
    timeout_s: float,
    report: Report,
    progress_every_s: float = 5.0,
    security: Mapping[str, str] | None = None,
) -> None:
    """Return once the broker answers a metadata request; KafkaServerError if the process
    exits or `timeout_s` passes first."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(_admin_config(bootstrap, security))
    began = time.monotonic()
    said = began
    while True:
        if process.poll() is not None:
            raise KafkaServerError(f"the Kafka broker exited with status {process.returncode}")
        try:
            # Blocks on librdkafka until the broker answers or a second has passed.
            admin.list_topics(timeout=1.0)
            return
        except KafkaException:
            pass
        now = time.monotonic()
        if now - began > timeout_s:
            raise KafkaServerError(f"the Kafka broker did not answer in {seconds_text(timeout_s)}")
        if now - said >= progress_every_s:
            report(f"waiting for the Kafka broker (pid {process.pid}): {now - began:.0f} s")
            said = now


def _admin_config(
    bootstrap: str, security: Mapping[str, str] | None = None
) -> dict[str, str | int | float | bool]:
    """An admin client's settings; `security`: a secured broker's (the admin's login)."""
    return {
        **(security or {}),
        "bootstrap.servers": bootstrap,
        # Until the broker listens, connections are refused: retry at a steady pace, not
        # librdkafka's backoff up to 10 s.
        "reconnect.backoff.ms": 50,
        "reconnect.backoff.max.ms": 200,
        # The refused connections are expected; their error lines would only alarm.
        "log_level": 2,
    }


def create_topics(
    bootstrap: str,
    topics: Iterable[TopicSpec] | None = None,
    timeout_s: float = 30.0,
    security: Mapping[str, str] | None = None,
) -> list[str]:
    """Create the declared topics that do not exist yet, and return once the broker leads every
    partition of the declared topics (after a restart too); the names created."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(_admin_config(bootstrap, security))
    wanted = list(declared_topics() if topics is None else topics)
    existing = admin.list_topics(timeout=timeout_s).topics
    missing = [spec for spec in wanted if spec.name not in existing]
    created = _create(admin, missing, timeout_s) if missing else []
    counts = {
        s.name: len(existing[s.name].partitions) if s.name in existing else s.partitions
        for s in wanted
    }
    await_leaders(bootstrap, counts, timeout_s, security)
    return created


def _create(admin: Any, missing: list[TopicSpec], timeout_s: float) -> list[str]:
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.cimpl import NewTopic

    futures = admin.create_topics(
        [NewTopic(s.name, s.partitions, 1, config=dict(s.config)) for s in missing],
        operation_timeout=timeout_s,
        request_timeout=timeout_s,
    )
    created = []
    for name, future in futures.items():
        try:
            future.result(timeout=timeout_s)
            created.append(name)
        except KafkaException as err:
            if err.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise KafkaServerError(f"creating topic {name}: {err.args[0].str()}") from None
    return created


def await_leaders(
    bootstrap: str,
    topics: dict[str, int],
    timeout_s: float,
    security: Mapping[str, str] | None = None,
) -> None:
    """Return once the broker leads every partition of `topics`: a topic's creation is
    committed by the controller before the broker takes up its partitions, and meanwhile the
    broker answers "not leader" to an offsets request (a reader's first step)."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer(
        {**_admin_config(bootstrap, security), "group.id": "tailguard-broker-start"}
    )
    deadline = time.monotonic() + timeout_s
    try:
        for topic, count in topics.items():
            for partition in range(count):
                while True:
                    try:
                        consumer.get_watermark_offsets(
                            TopicPartition(topic, partition), timeout=timeout_s
                        )
                        break
                    except KafkaException as err:
                        if time.monotonic() > deadline:
                            raise KafkaServerError(
                                f"{topic} [{partition}] has no leader after "
                                f"{seconds_text(timeout_s)}: "
                                f"{err.args[0].str()}"
                            ) from None
                    # Kafka tells nobody when a partition's leader takes it up: ask again soon.
                    time.sleep(0.05)
    finally:
        consumer.close()


def create_acls(
    bootstrap: str, security: Mapping[str, str], acls: Iterable[Acl], timeout_s: float = 30.0
) -> int:
    """Create `acls` (an ACL that exists already is left as it is: Kafka's CreateAcls is
    idempotent), logged in with the admin's `security` settings; how many were asked for."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.admin._acl import AclBinding, AclOperation, AclPermissionType
    from confluent_kafka.admin._resource import ResourcePatternType, ResourceType

    bindings = [
        AclBinding(
            ResourceType[acl.resource.upper()],
            acl.name,
            ResourcePatternType.PREFIXED if acl.prefixed else ResourcePatternType.LITERAL,
            f"User:{acl.principal}",
            "*",
            AclOperation[acl.operation.upper()],
            AclPermissionType.ALLOW,
        )
        for acl in acls
    ]
    admin = AdminClient(_admin_config(bootstrap, security))
    for binding, future in admin.create_acls(bindings, request_timeout=timeout_s).items():
        try:
            future.result(timeout=timeout_s)
        except KafkaException as err:
            raise KafkaServerError(f"creating ACL {binding}: {err.args[0].str()}") from None
    return len(bindings)
