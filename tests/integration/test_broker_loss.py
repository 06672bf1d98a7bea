"""The agent when the broker dies mid-job (kill -9) and comes back: the job succeeds on local
decisions, the archive is whole and replays clean, and what the broker missed reaches the
restarted broker in order. Also: a dying agent thread fails the job, and a used job id is
refused. The broker killed is the test's own Apache Kafka broker (killing the plugin's would
end other tests' data); the Spark session is the plugin's shared local[2] one."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tailguard.agent.driver.driver import JobDriver
from tailguard.agent.driver.hooks import JobHooks
from tailguard.agent.driver.ports import AgentThreadFailed
from tailguard.agent.entry import JobIdInUse, run
from tailguard.agent.graph.api import Job
from tailguard.broker.embedded import EmbeddedBroker
from tailguard.examples import sales_by_region
from tailguard.kafka.topic_reader import TopicReader
from tailguard.model import records as r
from tailguard.model.config import Settings
from tailguard.testing import Broker, JobRun, assert_replay_clean, ship_job_code

pytestmark = pytest.mark.spark


def small_job(tmp: Path) -> Job:
    data = sales_by_region.generate(tmp / "sales", files=2, rows_per_file=1_000)
    job = sales_by_region.make_job(data, tmp / "out")
    ship_job_code(job)
    return job


def settings_for(tmp: Path, bootstrap: str) -> Settings:
    return Settings(
        {
            "bootstrap.servers": bootstrap,
            "tailguard.work-dir": str(tmp / "work"),
            "tailguard.archive-dir": str(tmp / "archive"),
        }
    )


def topic_events(bootstrap: str, job_id: str) -> list[str]:
    """Ids of the job's events on the broker, in offset order (one partition per job key)."""
    reader = TopicReader({"bootstrap.servers": bootstrap}, [r.EVENTS_TOPIC], "broker-loss-test")
    from tailguard.codec import codec_for

    codec = codec_for(Settings({}))
    ids: list[str] = []
    try:
        while True:
            batch = reader.poll(2.0)
            if not batch:
                return ids
            for msg in batch:
                if msg.key() == job_id.encode():
                    ids.append(codec.decode(msg.value() or b"").id)
    finally:
        reader.close()


@pytest.mark.long
def test_broker_killed_mid_job_and_restarted(tailguard_local_spark: Any, tmp_path: Path) -> None:
    broker = EmbeddedBroker(tmp_path / "broker")
    bootstrap = broker.start()
    published: list[r.Event] = []
    killed_at: list[int] = []

    def chaos(event: r.Event) -> None:
        published.append(event)
        if isinstance(event, r.JobSubmitted):
            state = broker.status()
            assert state is not None
            os.kill(state.pid, signal.SIGKILL)  # by pid: this broker only
            os.waitpid(state.pid, 0)
            killed_at.append(len(published))
        elif isinstance(event, r.AttemptFinished) and killed_at and broker.status() is None:
            # Events went nowhere meanwhile: they wait in the producer's queue.
            assert len(published) > killed_at[0]
            assert broker.start() == bootstrap

    settings = settings_for(tmp_path, bootstrap)
    job = small_job(tmp_path)
    try:
        result = run(
            job,
            tailguard_local_spark,
            log_mode="kafka",
            services=False,
            settings=settings,
            progress=False,
            hooks=JobHooks(on_event=chaos),
        )
        assert killed_at and broker.status() is not None, "the broker was not killed/restarted"
        done = JobRun(job, result, settings, tmp_path)
        assert result.status == r.JobStatus.SUCCEEDED.value, result.message
        finished = [x.record for x in done.recorded if isinstance(x.record, r.JobFinished)]
        assert [r.JobStatus(f.status) for f in finished] == [r.JobStatus.SUCCEEDED]
        assert_replay_clean(done)
        # Kafka kept what it had before the kill on disk, and the restarted broker got
        # everything from the kill on (what the producer had queued): every event, in the order
        # published, once each.
        on_topic = topic_events(bootstrap, result.job_id)
        assert on_topic == [e.id for e in published]
    finally:
        broker.stop()


def test_a_dying_agent_thread_fails_the_job(
    tailguard_local_spark: Any, tailguard_broker: Broker, tmp_path: Path
) -> None:
    settings = settings_for(tmp_path, tailguard_broker.bootstrap)

    def fail(driver: JobDriver) -> None:
        driver.post(AgentThreadFailed("tg-runner-conn", OSError("connection table corrupt")))

    result = run(
        small_job(tmp_path),
        tailguard_local_spark,
        services=False,
        settings=settings,
        progress=False,
        hooks=JobHooks(on_start=fail),
    )
    assert result.status == r.JobStatus.FAILED.value
    assert "tg-runner-conn" in result.message and "connection table corrupt" in result.message


def test_a_used_job_id_is_refused_naming_recover(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, "127.0.0.1:1")
    (tmp_path / "archive").mkdir()
    (tmp_path / "archive" / "crashed-1.avro").write_bytes(b"Obj\x01")  # any content
    job = small_job(tmp_path)
    # Refused before anything starts: no Spark session is needed to find out.
    with pytest.raises(JobIdInUse, match=r"--recover crashed-1"):
        run(job, None, settings=settings, job_id="crashed-1", progress=False)
