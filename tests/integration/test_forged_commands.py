"""Forged commands against a real job (issue 10): the embedded broker, the five services as
separate processes signing what they emit, and the sales job on Spark `local[2]`.

With a signing key, a plain producer injects a FailJob, a BlockNodes of every host and a
SetParallelism (under the decider's own, predictable id) during the job, plus a FailJob signed
with another key and one signed with the right key by the wrong service: every one is rejected
with its reason, the job ends with the exact output, and its decisions still come from the
services. Without a key (today's behaviour, with a warning), a forged RestartTasks of the
finished source subtasks is taken, the job still ends exact (it once crashed the agent), and the
replay of the archive names the forgery. And the agent's own fallback decisions travel signed as
`agent`.
"""

from __future__ import annotations

import logging
import queue
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from tests.driver_inbox import wait_until_received

from tailguard.agent.driver.driver import JobDriver
from tailguard.agent.driver.hooks import JobHooks
from tailguard.agent.driver.ports import CommandReceived
from tailguard.archive import ArchiveReader, ArchiveWriter
from tailguard.codec import DecodeError, codec_for
from tailguard.examples import sales_by_region as example
from tailguard.kafka.dead_letters import DeadLetterReader
from tailguard.kafka.signing import KEY_SETTING, RecordSigner, SigningKey
from tailguard.model import records as r
from tailguard.model.authority import (
    AGENT,
    UNAUTHENTICATED_COMMANDS_TOPIC,
    UNAUTHENTICATED_FINDINGS_TOPIC,
    Signed,
)
from tailguard.model.config import Settings
from tailguard.model.ids import derived_id
from tailguard.replay.engine import replay
from tailguard.replay.inputs import read_archive
from tailguard.testing import Harness, run_settings

SIGNING_KEY = "forged-commands-test-key-0123456789abcdef"
POLICY = {
    "execution.batch.adaptive.auto-parallelism.avg-data-volume-per-task": "64 KiB",
    "execution.batch.adaptive.auto-parallelism.max-parallelism": "8",
    "restart-strategy.type": "fixed-delay",
    "restart-strategy.fixed-delay.delay": "100 ms",
}
# The sales example runs as two chains.
HEAD = "sales→score→partial"
TAIL = "final→sink"
UNSIGNED = "unauthenticated: unsigned (no tailguard.signature header)"
WARNING = "commands are unauthenticated"


@dataclass
class System:
    work: Path
    settings: Settings  # what the services run with (the key included), with this module's dirs
    bootstrap: str
    spark: Any
    data: Path


# The plugin's broker and services (signing with the key) and its local[2] session. Skipped with
# the reason where there is no JDK (tests/conftest.py).
pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.tailguard_services(settings={**POLICY, KEY_SETTING: SIGNING_KEY}),
]


@pytest.fixture(scope="module")
def system(
    tailguard_harness: Harness, request: pytest.FixtureRequest, tmp_path_factory: Any
) -> System:
    work = tmp_path_factory.mktemp("forged")
    services = tailguard_harness.services_of(request.node)
    spark = tailguard_harness.local_spark_of(request.node)
    data = example.generate(work / "data", files=4, rows_per_file=3_000)
    settings = run_settings(work, services, None)
    return System(work, settings, settings["bootstrap.servers"], spark, data)


def inject(system: System, driver: JobDriver, forged: list[tuple[r.Command, list]]) -> None:
    """Publish `forged` (command, headers) from a plain producer, and return once the agent's
    consumer has handed every one to the driver's inbox. Called on the driver's thread (from
    `on_start`/`on_event`), so they are handled right after, while the job runs."""
    codec = codec_for(system.settings)
    producer = Producer({"bootstrap.servers": system.bootstrap})
    for command, headers in forged:
        value = codec.encode(command)
        producer.produce(r.COMMANDS_TOPIC, value, command.job_id.encode(), headers=headers)
    assert producer.flush(10) == 0
    wait_until_received(driver, [command.id for command, _ in forged])


def forged_input(job: str, now: int, host: str) -> list[r.Record]:
    failed = r.AttemptFailed(
        job_id=job, ts=now, id="forged-failed", vertex=HEAD, subtask=0, attempt=0, host=host,
        error=r.ErrorKind.NODE_LOST, message="forged",
    )  # fmt: skip
    slow = r.SlowTasksDetected(
        job_id=job, ts=now, id="detector-forged", vertex=HEAD, speculation_safe=True,
        baseline_ms=1, baseline_ns_per_byte=None, hosts=(host,),
        slow=(r.SlowSubtask(subtask=0, live_attempts=(r.SlowAttempt(0, host, 60_000),),
                            latest_attempt=0),),
    )  # fmt: skip
    return [failed, slow]


def refused(system: System, topic: str, job: str, record_id: str, readers: int) -> list[str]:
    """The reasons of the dead letters the services filed for the forged record `record_id` of
    `job` (the broker is the session's: other modules' dead letters may be on the topic too,
    some for records of the same id: tests/contract/test_topic_scan.py forges these too)."""
    codec = codec_for(system.settings)
    reasons: list[str] = []
    deadline = time.monotonic() + 30
    with DeadLetterReader(system.settings, topic) as dlq:
        while len(reasons) < readers and time.monotonic() < deadline:
            for letter in dlq.poll(0.5):
                try:
                    record = codec.decode(letter.value)
                    if record.id == record_id and record.job_id == job:
                        reasons.append(letter.error)
                except DecodeError:
                    continue  # another test's garbage
    return reasons


def run(system: System, name: str, settings: Settings, hooks: JobHooks) -> tuple[Any, Path]:
    from tailguard.agent.entry import run as run_job

    out = system.work / "out" / name
    job = example.make_job(system.data, out, name=name)
    result = run_job(job, system.spark, settings=settings, progress=False, hooks=hooks)
    assert result.ok, result.summary()
    expected = example.reference(system.data)
    actual = example.read_output(out)
    assert actual[expected.columns.tolist()].equals(expected), "output differs from pandas"
    return result, Path(result.archive)


def test_forged_commands_are_rejected_with_reasons_and_the_output_is_exact(
    system: System, caplog: pytest.LogCaptureFixture
) -> None:
    injected: list[str] = []

    def forge(driver: JobDriver) -> None:
        job, now = driver.job_id, int(time.time() * 1000)
        right, other = SigningKey(SIGNING_KEY.encode()), SigningKey(b"another-key-" * 4)
        fail = r.FailJob(job_id=job, ts=now, id="failover-forged", reason="forged FailJob")
        every_host = r.BlockNodes(
            job_id=job,
            ts=now,
            id="blocklist-forged",
            hosts=tuple(sorted(driver.pool.hosts)),
            until_ts=now + 3_600_000,
            cause="forged",
        )
        # The id the decider will use for the final chain: ids are derived, so predictable.
        parallelism = r.SetParallelism(
            job_id=job,
            ts=now,
            id=derived_id("decider", job, TAIL),
            vertex=TAIL,
            parallelism=1,
            subtask_inputs=(),
        )
        wrong_key = r.FailJob(job_id=job, ts=now, id="failover-wrong-key", reason="forged")
        wrong_signer = r.FailJob(job_id=job, ts=now, id="blocklist-fail", reason="forged")
        codec = codec_for(system.settings)

        def signed(command: r.Command, key: SigningKey, signer: str) -> list:
            return RecordSigner(key, signer).headers(r.COMMANDS_TOPIC, codec.encode(command))

        forged = [
            (fail, []),
            (every_host, []),
            (parallelism, []),
            (wrong_key, signed(wrong_key, other, "failover")),
            (wrong_signer, signed(wrong_signer, right, "blocklist")),
        ]
        inject(system, driver, forged)
        injected.extend(c.id for c, _ in forged)
        # Forged input for the services, unsigned: a failed attempt for the failover service
        # and a slow host for the blocklist. With signing on, no service may act on them.
        producer = Producer({"bootstrap.servers": system.bootstrap})
        for record in forged_input(job, now, sorted(driver.pool.hosts)[0]):
            producer.produce(type(record).TOPIC, codec.encode(record), job.encode())
        assert producer.flush(10) == 0

    caplog.set_level(logging.WARNING)
    result, archive = run(system, "signed", system.settings, JobHooks(on_start=forge))

    reasons = {cid: reason for cid, _, reason in result.commands_rejected}
    assert set(reasons) == set(injected), result.commands_rejected
    assert reasons["failover-forged"] == UNSIGNED
    assert reasons["blocklist-forged"] == UNSIGNED
    assert reasons[derived_id("decider", result.job_id, TAIL)] == UNSIGNED
    assert reasons["failover-wrong-key"].startswith("unauthenticated: signed with an unknown key")
    assert reasons["blocklist-fail"] == (
        "not permitted: FailJob is accepted only from failover, not blocklist"
    )
    assert not result.blocked
    # The control: the services' own signed commands were applied. Every adaptive vertex was
    # decided by the decider (the forged SetParallelism took its id first, and used up nothing).
    assert {by for _, by in result.parallelism.values()} == {"decider"}
    assert result.commands_applied >= 2
    assert not [m for m in caplog.messages if WARNING in m]

    log = [(e.topic, e.direction, e.record) for e in ArchiveReader(archive)]
    quarantined = {rec.id for t, _, rec in log if t == UNAUTHENTICATED_COMMANDS_TOPIC}
    assert quarantined == set(injected) - {"blocklist-fail"}  # that one's signature is valid
    assert all(SIGNING_KEY not in repr(rec) for _, _, rec in log)
    assert SIGNING_KEY.encode() not in archive.read_bytes()

    # The forged input: refused by every service that reads its topic, with the reason, and the
    # finding the agent received kept apart in the archive, where a replay does not feed it on.
    job = result.job_id
    assert refused(system, r.EVENTS_TOPIC, job, "forged-failed", 3) == [UNSIGNED] * 3
    assert refused(system, r.FINDINGS_TOPIC, job, "detector-forged", 2) == [UNSIGNED] * 2
    assert [rec.id for t, _, rec in log if t == UNAUTHENTICATED_FINDINGS_TOPIC] == [
        "detector-forged"
    ]

    report = replay(read_archive(archive, system.settings), system.settings)
    assert report.differences == 0, [s.line() for s in report.services] + report.notes(10)
    assert {x.command.id for x in report.rejected} == set(injected)
    decider = next(s for s in report.services if s.service == "decider")
    assert decider.reproduced >= 2


def test_without_a_key_a_forged_restart_of_finished_sources_is_taken_and_the_job_is_exact(
    system: System, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings({k: v for k, v in system.settings.items() if k != KEY_SETTING})
    head_parallelism: list[int] = []
    finished: set[int] = set()
    forged: list[r.RestartTasks] = []
    runner: list[JobDriver] = []

    def restart_finished_sources(event: r.Event) -> None:
        if isinstance(event, r.VertexInitialized) and event.vertex == HEAD:
            head_parallelism.append(event.parallelism)
        if isinstance(event, r.AttemptFinished) and event.vertex == HEAD:
            finished.add(event.subtask)
        if forged or not head_parallelism or len(finished) < head_parallelism[0]:
            return
        restart = r.RestartTasks(
            job_id=event.job_id,
            ts=event.ts,
            id="forged-restart",
            tasks=tuple(r.TaskRef(HEAD, k) for k in sorted(finished)),
            reason="forged",
            not_before_ts=0,
        )
        forged.append(restart)
        inject(system, runner[0], [(restart, [])])

    caplog.set_level(logging.WARNING)
    hooks = JobHooks(on_start=runner.append, on_event=restart_finished_sources)
    result, archive = run(system, "unsigned", settings, hooks)

    assert [m for m in caplog.messages if WARNING in m], "no warning that commands are open"
    assert forged, "the head chain never finished"
    assert "forged-restart" not in {cid for cid, _, _ in result.commands_rejected}
    reran = {(a.subtask, a.attempt) for a in result.attempts if a.vertex == HEAD}
    assert {(k, 1) for k in range(head_parallelism[0])} <= reran, reran
    # Replay cannot know who sent it, but no service emits it: the audit names it.
    report = replay(read_archive(archive, settings), settings)
    assert [x.id for x in report.unattributed] == ["forged-restart"]
    assert report.differences == 1, [s.line() for s in report.services]


def test_the_agent_signs_its_own_fallback_decisions_as_agent(
    system: System, tmp_path: Path
) -> None:
    """A decision the agent takes itself goes on the commands topic signed as `agent`, and comes
    back to it through its consumer verified (then it is ignored as an id already handled)."""
    from tailguard.agent.adapters.kafka import KafkaPublisher

    job = f"fallback-{time.time_ns()}"
    arrived: queue.Queue[CommandReceived] = queue.Queue()
    codec = codec_for(system.settings)
    writer = ArchiveWriter(tmp_path / "fallback.avro")
    died: list[BaseException] = []
    publisher = KafkaPublisher(
        writer, codec, system.settings, job, arrived.put,
        start_at_ms=time.time_ns() // 1_000_000 - 60_000, on_failure=died.append,
    )  # fmt: skip
    decision = r.FailJob(job_id=job, ts=1, id=derived_id("failover", job, "x"), reason="limit")
    try:
        publisher.local(decision)
        echo = arrived.get(timeout=60)
    finally:
        publisher.close()
    key = SigningKey.parse(SIGNING_KEY, KEY_SETTING)
    assert echo == CommandReceived(decision, Signed(AGENT, key.key_id)) and not died
