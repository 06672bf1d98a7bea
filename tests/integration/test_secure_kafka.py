"""Secured Kafka, run for real (issue 25 item 4): Apache Kafka's broker with SASL_SSL, SCRAM-SHA-512
logins and the ACLs of docs/security.md (`EmbeddedBroker(secure=True)`, what `tailguard broker up
--secure` starts), the five services as separate processes each logged in as its own principal,
and the sales job on Spark `local[2]` whose agent logs in as `tailguard-agent`.

While the job runs, the detector's principal - which may write findings, not commands - tries to
publish a FailJob to `tailguard.commands`: the broker refuses it (TOPIC_AUTHORIZATION_FAILED), so
the agent never sees it, and the job ends with the exact output, its decisions from the
services, and a replay with 0 differences. Afterwards no password and no signing key is in any
topic, the archive, a log (the broker's, each service's, this test's) or a metric.

Minutes on 2 cores (a broker of its own, the services, Spark), so not in `make test`:
`make test-secure-kafka` (TAILGUARD_SECURE_KAFKA=1).
"""

from __future__ import annotations

import logging
import os
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from tailguard.agent.driver.driver import JobDriver
from tailguard.agent.driver.hooks import JobHooks
from tailguard.broker.acls import (
    ADMIN,
    AGENT,
    AUDITOR,
    SERVICE_TOPICS,
    principals,
    service_principal,
)
from tailguard.broker.embedded import EmbeddedBroker
from tailguard.broker.kafka_server import kafka_dir
from tailguard.broker.secure import SecureBroker, existing
from tailguard.codec import codec_for
from tailguard.examples import sales_by_region as example
from tailguard.kafka.signing import KEY_SETTING
from tailguard.kafka.topics import declared_topics
from tailguard.model import records as r
from tailguard.model.config import Settings
from tailguard.replay.engine import replay
from tailguard.replay.inputs import read_archive
from tailguard.settings_file import load_settings
from tailguard.shell import supervisor
from tailguard.testing import Harness
from tailguard.testing.harness import toml_settings

SIGNING_KEY = "secure-kafka-test-key-0123456789abcdef0123"
POLICY = {
    "execution.batch.adaptive.auto-parallelism.avg-data-volume-per-task": "64 KiB",
    "execution.batch.adaptive.auto-parallelism.max-parallelism": "8",
}
# The principal that tries to command the job: a real one (the detector's), whose ACLs let it
# write findings only.
INTRUDER = service_principal("detector")
# The services with a principal of their own (tests/unit/test_kafka_acls.py: all five).
SERVICE_NAMES = tuple(SERVICE_TOPICS)

pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("TAILGUARD_SECURE_KAFKA") != "1",
        reason="secured Kafka end to end: make test-secure-kafka (TAILGUARD_SECURE_KAFKA=1)",
    ),
]


@dataclass
class Secured:
    work: Path
    bootstrap: str
    broker_work: Path
    material: SecureBroker
    services_work: Path
    settings: Settings  # the agent's: its login (password included, in memory only) and policy
    spark: Any
    data: Path

    def secrets(self) -> dict[str, bytes]:
        """Every secret of this system, by name: what must be found nowhere."""
        found = {p: self.material.password(p).encode() for p in principals()}
        return {**found, "signing key": SIGNING_KEY.encode()}


@pytest.fixture(scope="module")
def secured(
    tailguard_harness: Harness, request: pytest.FixtureRequest, tmp_path_factory: Any
) -> Iterator[Secured]:
    work = tmp_path_factory.mktemp("secure-kafka")
    broker = EmbeddedBroker(work / "broker", secure=True)
    began = time.monotonic()
    bootstrap = broker.start()
    state = broker.status()
    assert state is not None
    if tailguard_harness.ledger is not None:
        tailguard_harness.ledger.record(state.pid, f"secured Kafka broker {bootstrap}")
    print(f"secured broker ready in {time.monotonic() - began:.1f} s")
    material = existing(kafka_dir(work / "broker").resolve())
    assert material is not None
    services_work = work / "services"
    services_work.mkdir()
    # One settings file for all five: no login in it; each service's comes from its environment
    # (its username, and the file holding its password).
    config = services_work / "tailguard.toml"
    shared = {
        **POLICY,
        KEY_SETTING: SIGNING_KEY,
        "bootstrap.servers": bootstrap,
        "tailguard.work-dir": str(services_work),
        **{k: v for k, v in material.settings(AGENT).items() if k != "kafka.sasl.username"},
    }
    config.write_text(toml_settings(shared))
    try:
        began = time.monotonic()
        supervisor.start(
            services_work,
            SERVICE_NAMES,
            config=str(config),
            report=lambda _line: None,
            on_launch=lambda name, pid: (
                tailguard_harness.ledger.record(pid, f"secured service {name}")
                if tailguard_harness.ledger is not None
                else None
            ),
            env_of=lambda name: material.environment(service_principal(name)),
        )
        print(f"five services ready in {time.monotonic() - began:.1f} s")
        spark = tailguard_harness.local_spark_of(request.node)
        data = example.generate(work / "data", files=4, rows_per_file=3_000)
        agent = {
            **load_settings(config, environ={}).overrides(),
            **material.settings(AGENT),
            "kafka.sasl.password": material.password(AGENT),
            "tailguard.work-dir": str(work / "agent"),
            "tailguard.archive-dir": str(work / "archive"),
        }
        yield Secured(
            work, bootstrap, work / "broker", material, services_work, Settings(agent), spark, data
        )
    finally:
        supervisor.stop(services_work, list(SERVICE_NAMES), report=lambda _line: None)
        broker.stop()


def publish_as(secured: Secured, principal: str, topic: str, record: r.Record) -> KafkaError | None:
    """Publish `record` to `topic` logged in as `principal`; the broker's answer (None: taken)."""
    producer = Producer(
        {"bootstrap.servers": secured.bootstrap, **secured.material.librdkafka_config(principal)}
    )
    answers: list[KafkaError | None] = []
    value = codec_for(secured.settings).encode(record)
    producer.produce(
        topic, value, record.job_id.encode(), on_delivery=lambda err, _msg: answers.append(err)
    )
    producer.flush(30)
    assert len(answers) == 1, "no delivery report in 30 s"
    return answers[0]


def topic_bytes(secured: Secured) -> bytes:
    """Every key, value and header of every record on every declared topic, read as the admin."""
    consumer = Consumer(
        {
            "bootstrap.servers": secured.bootstrap,
            **secured.material.librdkafka_config(ADMIN),
            "group.id": "secure-kafka-test-scan",
            "enable.auto.commit": False,
        }
    )
    chunks: list[bytes] = []
    try:
        for spec in declared_topics():
            for partition in range(spec.partitions):
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(spec.name, partition), timeout=30
                )
                if high <= low:
                    continue
                consumer.assign([TopicPartition(spec.name, partition, low)])
                position = low
                while position < high:
                    message = consumer.poll(10)
                    assert message is not None, f"{spec.name} [{partition}]: stalled at {position}"
                    assert message.error() is None, message.error()
                    chunks += [_raw(message.key()), _raw(message.value())]
                    chunks += [_raw(header[1]) for header in message.headers() or []]
                    offset = message.offset()
                    assert offset is not None
                    position = offset + 1
    finally:
        consumer.close()
    return b"\n".join(chunks)


def _raw(part: str | bytes | None) -> bytes:
    return part.encode() if isinstance(part, str) else part or b""


def test_the_job_runs_exact_over_sasl_ssl_and_a_principal_without_write_access_is_refused(
    secured: Secured, caplog: pytest.LogCaptureFixture
) -> None:
    from tailguard.agent.entry import run as run_job

    refusals: list[KafkaError | None] = []

    def intrude(driver: JobDriver) -> None:
        # While the job runs: a FailJob from a principal that may not write the topic.
        forged = r.FailJob(
            job_id=driver.job_id, ts=int(time.time() * 1000), id="failover-intruder",
            reason="sent by a principal without write access",
        )  # fmt: skip
        refusals.append(publish_as(secured, INTRUDER, r.COMMANDS_TOPIC, forged))

    caplog.set_level(logging.INFO)
    out = secured.work / "out"
    job = example.make_job(secured.data, out, name="secured")
    began = time.monotonic()
    result = run_job(
        job, secured.spark, settings=secured.settings, progress=False,
        hooks=JobHooks(on_start=intrude),
    )  # fmt: skip
    print(f"job on the secured broker: {time.monotonic() - began:.1f} s")

    # The broker refused the intruder: the record never reached the topic.
    assert len(refusals) == 1 and refusals[0] is not None, refusals
    assert refusals[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, refusals[0]
    # The job went on unharmed: exact output, every decision from the services over SASL_SSL.
    assert result.ok, result.summary()
    expected = example.reference(secured.data)
    actual = example.read_output(out)
    assert actual[expected.columns.tolist()].equals(expected), "output differs from pandas"
    assert not result.commands_rejected, result.commands_rejected
    assert {by for _, by in result.parallelism.values()} == {"decider"}, result.parallelism
    assert result.commands_applied >= 2
    assert result.archive is not None
    archive = Path(result.archive)
    report = replay(read_archive(archive, secured.settings), secured.settings)
    assert report.differences == 0, [s.line() for s in report.services] + report.notes(10)
    # Each service did its work logged in as itself, and is still ready.
    running = supervisor.running(secured.services_work)
    assert sorted(running) == sorted(SERVICE_NAMES)
    metrics_text = []
    for name, service in running.items():
        assert service.healthy(), (name, service.health())
        with urllib.request.urlopen(f"{service.metrics_url}/metrics", timeout=5) as reply:
            metrics_text.append(reply.read())
    decider = running["decider"].metrics()
    assert decider['tailguard_service_records_emitted_total{record="SetParallelism"}'] >= 2

    # No secret anywhere: topics, archive, logs (broker, services, this test), metrics.
    places = {
        "topics": topic_bytes(secured),
        "archive": archive.read_bytes(),
        "broker log": (secured.broker_work / "broker.log").read_bytes(),
        "metrics": b"\n".join(metrics_text),
        "test log": caplog.text.encode(),
        **{
            f"{name} log": (
                supervisor.services_dir(secured.services_work) / f"{name}.log"
            ).read_bytes()
            for name in SERVICE_NAMES
        },
    }
    assert len(places["topics"]) > 0 and len(places["broker log"]) > 0
    # The format's argument file, which held every password, is gone.
    assert not list(secured.material.directory.glob("*.args"))
    leaks = [
        f"{secret} in {place}"
        for secret, value in secured.secrets().items()
        for place, content in places.items()
        if value in content
    ]
    assert not leaks, leaks


def test_a_wrong_password_or_no_tls_gets_no_connection_and_a_reader_cannot_write(
    secured: Secured,
) -> None:
    """The broker's other refusals: SCRAM with a wrong password, a client that does not speak
    TLS, and the auditor, who may read every record topic, writing one."""
    errors: list[KafkaError] = []
    wrong = {
        **secured.material.librdkafka_config(AGENT),
        "sasl.password": "not-the-password",
        "bootstrap.servers": secured.bootstrap,
        "error_cb": errors.append,
    }
    refused = Consumer({**wrong, "group.id": "secure-kafka-wrong"})
    with pytest.raises(KafkaException):
        refused.list_topics(timeout=10)
    refused.close()
    assert KafkaError._AUTHENTICATION in {e.code() for e in errors}, errors
    plain = Consumer({"bootstrap.servers": secured.bootstrap, "group.id": "secure-kafka-plain"})
    with pytest.raises(KafkaException):
        plain.list_topics(timeout=5)
    plain.close()
    record = r.FailJob(job_id="secure-kafka-reader", ts=1, id="failover-reader", reason="reader")
    answer = publish_as(secured, AUDITOR, r.EVENTS_TOPIC, record)
    assert answer is not None and answer.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, answer
