"""A dead driver's log completed from the topics (agent/adapters/job_log.py) with signing on:
the events its agent signed, and the commands whose signature checks out. A forged event is no
fact of the job's, and a forged command no decision to restore (the session's broker, real
signatures)."""

from __future__ import annotations

import uuid
from pathlib import Path

from confluent_kafka import Producer

from tailguard.agent.adapters.job_log import read_recovery_log
from tailguard.codec import codec_for
from tailguard.kafka.signing import KEY_SETTING, RecordSigner, SigningKey
from tailguard.model import records as r
from tailguard.model.authority import AGENT
from tailguard.model.config import Settings
from tailguard.testing import Broker

KEY = "recovery-log-topics-key-0123456789abcdef"


def test_the_topics_give_only_what_the_agent_and_the_services_signed(
    tmp_path: Path, tailguard_broker: Broker
) -> None:
    bootstrap = tailguard_broker.bootstrap
    # The broker is the session's: a job id of this test's own.
    job = f"job-{uuid.uuid4().hex[:8]}"
    settings = Settings({"bootstrap.servers": bootstrap, KEY_SETTING: KEY})
    codec = codec_for(settings)
    producer = Producer({"bootstrap.servers": bootstrap})
    agent = RecordSigner(SigningKey(KEY.encode()), AGENT)
    failover = RecordSigner(SigningKey(KEY.encode()), "failover")

    def send(record: r.Record, signer: RecordSigner | None) -> None:
        topic, value = type(record).TOPIC, codec.encode(record)
        headers = list(signer.headers(topic, value)) if signer is not None else []
        producer.produce(topic, value, job.encode(), headers=headers)

    restart = r.RestartTasks(
        job_id=job, ts=3, id="failover-1", tasks=(), reason="x", not_before_ts=0
    )
    forged = r.RestartTasks(
        job_id=job, ts=3, id="failover-2", tasks=(), reason="forged", not_before_ts=0
    )
    send(r.Tick(job_id=job, ts=1, id=f"{job}-e1"), agent)
    send(r.Tick(job_id=job, ts=2, id=f"{job}-e2"), None)  # forged
    send(restart, failover)
    send(forged, None)
    assert producer.flush(10) == 0

    log = read_recovery_log(job, str(tmp_path / "none.avro"), settings, topics=True)
    assert [e.id for e in log.job_log.events] == [f"{job}-e1"]
    assert log.job_log.commands == {"failover-1": restart}
