"""Secrets never leave the process.

Distinctive secrets are planted in the settings file (`kafka.sasl.password`,
`schema-registry.basic.auth.user.info`, `security.command-signing.key`, `s3.secret-key`) and in
the environment through its mapping (`kafka.ssl.key.password`, `s3.access-key` from a
`_FILE`, `security.command-signing.previous-keys`). A real job then runs with the five services
on the embedded broker (PLAINTEXT: the Kafka secrets are set without switching the protocol,
and librdkafka and faust accept that), and the test reads every topic on the broker (values,
keys and headers), the archive, every file the agent, the services and the broker wrote, every
metrics and health page, the test process's own output and logs, and the output of the CLI
(`tailguard services status`, `tailguard replay`), and finds none of the secrets - in plain
text, base64 or hex.

Controls: the scanner finds each planted secret in the inputs it was planted in, and finds a
distinctive policy value - which is meant to be recorded - in the topics and the archive.
"""

from __future__ import annotations

import base64
import logging
import os
import secrets
import subprocess
import sys
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from tailguard import stack
from tailguard.archive import ArchiveReader
from tailguard.examples import sales_by_region
from tailguard.model import records as r
from tailguard.replay.inputs import read_archive
from tailguard.settings_file import load_settings
from tailguard.shell import supervisor

# Skipped without Java (tests/conftest.py).
pytestmark = [pytest.mark.spark, pytest.mark.slow]

# Meant to be recorded (a policy setting): the positive control for topics and archive.
RECORDED_POLICY = ("decider.timeout", "4321 ms")


def planted(name: str) -> str:
    # Distinctive and long enough for the signing keys (32 bytes at least).
    return f"PLANTED-{name}-{secrets.token_hex(16)}"


@dataclass
class Planted:
    in_file: dict[str, str]
    in_env: dict[str, str]  # setting -> value, set through the environment mapping
    environ: dict[str, str]  # the variables that carry them
    inputs: list[Path]  # the files holding them, which the scan leaves out

    @property
    def values(self) -> dict[str, str]:
        return {**self.in_file, **self.in_env}


def plant(work: Path) -> Planted:
    in_file = {
        "kafka.sasl.password": planted("kafka-sasl"),
        "schema-registry.basic.auth.user.info": "svc:" + planted("registry"),
        "security.command-signing.key": planted("signing"),
        "s3.secret-key": planted("s3-secret"),
    }
    in_env = {
        "kafka.ssl.key.password": planted("env-ssl-key"),
        "security.command-signing.previous-keys": planted("env-previous-signing"),
        "s3.access-key": planted("file-s3-access"),
    }
    access_key_file = work / "secrets" / "s3-access-key"
    access_key_file.parent.mkdir(parents=True)
    access_key_file.write_text(in_env["s3.access-key"] + "\n")
    environ = {
        "TAILGUARD_KAFKA_SSL_KEY_PASSWORD": in_env["kafka.ssl.key.password"],
        "TAILGUARD_SECURITY_COMMAND__SIGNING_PREVIOUS__KEYS": in_env[
            "security.command-signing.previous-keys"
        ],
        "TAILGUARD_S3_ACCESS__KEY_FILE": str(access_key_file),
    }
    values = {
        "tailguard.work-dir": str(work),
        "tailguard.archive-dir": str(work / "archive"),
        "execution.batch.adaptive.auto-parallelism.avg-data-volume-per-task": "64 KiB",
        "execution.batch.adaptive.auto-parallelism.max-parallelism": "4",
        RECORDED_POLICY[0]: RECORDED_POLICY[1],
        **in_file,
    }
    config = work / "tailguard.toml"
    config.write_text("".join(f'"{k}" = "{v}"\n' for k, v in values.items()))
    return Planted(in_file, in_env, environ, [config, access_key_file])


def forms(secret: str) -> list[bytes]:
    """How a leaked secret could look: as is, base64 (e.g. HTTP basic auth), hex."""
    raw = secret.encode()
    return [raw, base64.b64encode(raw), raw.hex().encode()]


def find(secret_values: Mapping[str, str], haystacks: Mapping[str, bytes]) -> list[str]:
    """'<setting> in <where>' for every secret found in any form."""
    found = []
    for where, data in haystacks.items():
        for key, secret in secret_values.items():
            # For user:password, the password alone is the secret.
            parts = {secret, secret.rpartition(":")[2]}
            if any(form in data for part in parts for form in forms(part)):
                found.append(f"{key} in {where}")
    return found


@dataclass
class Scan:
    haystacks: dict[str, bytes] = field(default_factory=dict)

    def add(self, where: str, data: bytes | str) -> None:
        self.haystacks[where] = data.encode() if isinstance(data, str) else data


def every_message(bootstrap: str) -> Iterator[tuple[str, bytes]]:
    """(topic[partition]@offset, key + value + headers) of every message on the broker."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "secrets-scan", "enable.auto.commit": False}
    )
    try:
        for topic, meta in consumer.list_topics(timeout=10).topics.items():
            for partition in meta.partitions:
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=10
                )
                if high <= low:
                    continue
                consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
                offset = low
                while offset < high:
                    msg = consumer.poll(10)
                    assert msg is not None, f"{topic}[{partition}] stalled at {offset}"
                    if msg.error():
                        continue
                    headers = b"".join(k.encode() + (v or b"") for k, v in (msg.headers() or []))
                    offset = (msg.offset() or 0) + 1
                    yield (
                        f"{topic}[{partition}]@{offset - 1}",
                        (msg.key() or b"") + (msg.value() or b"") + headers,
                    )
    finally:
        consumer.close()


def files_under(root: Path, leave_out: Iterable[Path]) -> Iterator[Path]:
    skipped = {p.resolve() for p in leave_out}
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.resolve() not in skipped:
            yield path


def cli(
    args: list[str], work: Path, planted_env: Mapping[str, str]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tailguard.cli", "--config", str(work / "tailguard.toml"), *args],
        env={**os.environ, **planted_env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def page(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as reply:
        return bytes(reply.read())


def test_no_secret_in_any_topic_archive_log_metric_or_cli_output(
    tailguard_local_spark: Any, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The broker and the services are this test's own, in its work dir, started with the
    planted environment: every file they write is scanned. Spark is the plugin's local[2]."""
    from tailguard.agent.entry import run

    work = tmp_path / "work"
    work.mkdir()
    plants = plant(work)
    settings = load_settings(work / "tailguard.toml", environ={**os.environ, **plants.environ})
    # The environment mapping delivered what was planted there.
    assert {k: settings[k] for k in plants.in_env} == plants.in_env
    scan = Scan()

    # Everything the agent logs (tailguard at DEBUG, other libraries at their own levels).
    agent_log = logging.FileHandler(work / "agent.log")
    root, ours = logging.getLogger(), logging.getLogger("tailguard")
    old_level = ours.level
    root.addHandler(agent_log)
    ours.setLevel(logging.DEBUG)
    data = sales_by_region.generate(tmp_path / "data", files=2, rows_per_file=2_000)
    with ExitStack() as stop:
        stop.callback(ours.setLevel, old_level)
        stop.callback(root.removeHandler, agent_log)
        bootstrap = stop.enter_context(stack.broker(work))
        services = supervisor.start(
            work, config=str(work / "tailguard.toml"), env=plants.environ, report=lambda _m: None
        )
        stop.callback(supervisor.stop, work, report=lambda _m: None)
        for service in services.values():
            # The services were started with the planted variables.
            environ = Path(f"/proc/{service.pid}/environ").read_bytes()
            assert plants.environ["TAILGUARD_KAFKA_SSL_KEY_PASSWORD"].encode() in environ
        result = run(
            sales_by_region.make_job(data, tmp_path / "out"),
            tailguard_local_spark,
            settings=settings,
            progress=False,
        )
        assert result.ok, result.summary()

        for name, service in services.items():
            scan.add(f"{name} /metrics", page(f"{service.metrics_url}/metrics"))
            scan.add(f"{name} /health", page(f"{service.metrics_url}/health"))
        status = cli(["services", "status", "--work-dir", str(work)], work, plants.environ)
        assert status.returncode == 0, status.stderr
        scan.add("tailguard services status", status.stdout + status.stderr)
        replayed = cli(["replay", str(result.archive)], work, plants.environ)
        # Replay works from what was recorded (policy settings and markers only).
        assert replayed.returncode == 0, replayed.stdout + replayed.stderr
        scan.add("tailguard replay", replayed.stdout + replayed.stderr)
        for where, message in every_message(bootstrap):
            scan.add(where, message)
        agent_log.close()
    # Services stopped (their logs complete), broker stopped.

    archive = Path(result.archive)
    log = [item.record for item in read_archive(archive, settings)]
    for n, envelope in enumerate(ArchiveReader(archive)):
        scan.add(f"archive entry {n} ({envelope.topic})", repr(envelope))
    scan.add("archive records", repr(log))
    for path in files_under(work, plants.inputs):
        scan.add(str(path.relative_to(work)), path.read_bytes())
    out, err = capfd.readouterr()
    scan.add("test process stdout", out)
    scan.add("test process stderr", err)

    for name in supervisor.SERVICE_NAMES:
        assert f"services/{name}.log" in scan.haystacks
    assert "agent.log" in scan.haystacks and "broker.log" in scan.haystacks
    assert any("@" in w for w in scan.haystacks), "no message read from the broker"
    leaks = find(plants.values, scan.haystacks)
    assert not leaks, f"secrets leaked: {leaks}"
    submitted = next(x for x in log if isinstance(x, r.JobSubmitted))
    assert submitted.config[RECORDED_POLICY[0]] == RECORDED_POLICY[1]
    assert not set(submitted.config) & set(plants.values)
    # The services' commands were signed with the planted key and applied: the secrets were
    # in use, not merely present.
    assert any(isinstance(x, r.CommandApplied) for x in log)

    # Controls: the scanner finds a planted secret where it was planted, and finds a recorded
    # policy value where settings would have leaked to (the topics and the archive).
    inputs = {str(p): p.read_bytes() for p in plants.inputs}
    assert sorted(find(plants.in_file, inputs)) == sorted(
        f"{k} in {work / 'tailguard.toml'}" for k in plants.in_file
    )
    assert find({"s3.access-key": plants.in_env["s3.access-key"]}, inputs)
    policy = {"policy": RECORDED_POLICY[1]}
    assert find(policy, {k: v for k, v in scan.haystacks.items() if "@" in k})
    assert find(policy, {k: v for k, v in scan.haystacks.items() if k.startswith("archive")})


def test_the_scanner_sees_every_form() -> None:
    secret = planted("control")
    for form in forms(secret):
        assert find({"k": secret}, {"blob": b"..." + form + b"..."}) == ["k in blob"]
    assert find({"k": "user:" + secret}, {"blob": secret.encode()}) == ["k in blob"]
    assert find({"k": secret}, {"blob": b"nothing here"}) == []
