"""`read_to_end`: a topic read once, up to the ends fixed before the read (replay, a service's
rebuild and the fleet list read topics this way)."""

from __future__ import annotations

from tailguard.kafka.producer import Headers, RecordProducer
from tailguard.kafka.topic_scan import read_only_consumer, read_to_end, watermarks
from tailguard.model.config import Settings

KEYS = [f"job-{k}".encode() for k in range(8)]


def _publish(settings: Settings, topic: str, values: range) -> None:
    producer = RecordProducer(settings)
    for i in values:
        producer.send_bytes(topic, KEYS[i % len(KEYS)], str(i).encode())
    producer.flush()
    producer.close()


def test_reads_every_partition_up_to_the_ends_seen_before_it_began(
    settings: Settings, topic: str
) -> None:
    _publish(settings, topic, range(200))
    consumer = read_only_consumer(settings, "test-scan")
    try:
        messages = read_to_end(consumer, topic, stall_s=10.0)
        first = next(messages)
        # Published while the read runs: past the ends it read first, so not part of it.
        _publish(settings, topic, range(200, 260))
        read = [first, *messages]
    finally:
        consumer.close()
    values = [int(m.value() or b"") for m in read]
    assert sorted(values) == list(range(200))
    for key in KEYS:  # per key (one partition each), in the order published
        mine = [int(m.value() or b"") for m in read if m.key() == key]
        assert mine == sorted(mine)


def test_reads_only_the_given_ranges(settings: Settings, topic: str) -> None:
    _publish(settings, topic, range(100))
    consumer = read_only_consumer(settings, "test-scan")
    try:
        held = watermarks(consumer, topic, 10.0)
        partition = max(held, key=lambda p: held[p][1] - held[p][0])
        low, high = held[partition]
        assert high - low >= 3
        middle = [
            m.offset()
            for m in read_to_end(
                consumer, topic, starts={partition: low + 1}, ends={partition: high - 1}
            )
        ]
        # An end past the partition's end reads to its end; a start below the oldest, from it.
        whole = [
            m.offset()
            for m in read_to_end(consumer, topic, starts={partition: -5}, ends={partition: 10**9})
        ]
    finally:
        consumer.close()
    assert middle == list(range(low + 1, high - 1))
    assert whole == list(range(low, high))


def test_a_missing_topic_is_empty_and_stays_missing(settings: Settings, topic: str) -> None:
    consumer = read_only_consumer(settings, "test-scan")
    try:
        assert list(read_to_end(consumer, topic, stall_s=5.0)) == []
        assert watermarks(consumer, topic, 5.0) == {}
    finally:
        consumer.close()


def test_nothing_to_read_when_the_range_is_empty(settings: Settings, topic: str) -> None:
    _publish(settings, topic, range(10))
    consumer = read_only_consumer(settings, "test-scan")
    try:
        held = watermarks(consumer, topic, 10.0)
        # Ends at the starts: nothing, at once (no wait for a record that will not come).
        ends = {p: high for p, (_, high) in held.items()}
        assert list(read_to_end(consumer, topic, starts=ends, ends=ends, stall_s=30.0)) == []
    finally:
        consumer.close()


def test_replay_reads_a_topic_partition_after_partition(settings: Settings, topic: str) -> None:
    from tailguard.replay.inputs import _read_topic

    _publish(settings, topic, range(120))
    consumer = read_only_consumer(settings, "test-scan")
    try:
        expected = [
            m.value()
            for m in sorted(read_to_end(consumer, topic), key=lambda m: (m.partition(), m.offset()))
        ]
    finally:
        consumer.close()
    assert [m.value() for m in _read_topic(settings, topic)] == expected
    assert len(expected) == 120


def test_a_range_the_broker_no_longer_holds_is_read_as_what_is_left(
    settings: Settings, topic: str, backend: str
) -> None:
    # 8 MiB to one partition: the mock broker keeps its newest ~5 MiB (Kafka all).
    producer = RecordProducer(settings)
    for _ in range(8_000):
        producer.send_bytes(topic, b"one-key", b"x" * 1024)
    producer.flush()
    producer.close()
    consumer = read_only_consumer(settings, "test-scan")
    try:
        [(partition, (low, high))] = [
            (p, held) for p, held in watermarks(consumer, topic, 10.0).items() if held[1] > 0
        ]
        # A service that committed offset 100 and was down meanwhile: its rebuild reads
        # [0, 100), and whatever of it is gone is not waited for.
        read = [
            m.offset() for m in read_to_end(consumer, topic, ends={partition: 100}, stall_s=5.0)
        ]
    finally:
        consumer.close()
    if backend == "mock":
        assert low > 100  # the case this test is about: the range is gone
    assert read == list(range(low, min(high, 100)))


def test_replay_reads_the_topics_as_the_services_and_the_agent_took_them(
    settings: Settings,
) -> None:
    """With signing on, an event its agent did not sign is no fact of the job's (every service
    refused it), and a forged command or finding comes under the archive's topics for them."""
    import uuid

    from tailguard.codec import codec_for
    from tailguard.kafka.signing import KEY_SETTING, signer_for
    from tailguard.model import records as r
    from tailguard.model.authority import (
        AGENT,
        UNAUTHENTICATED_COMMANDS_TOPIC,
        UNAUTHENTICATED_FINDINGS_TOPIC,
    )
    from tailguard.replay.inputs import read_topic

    signed_settings = Settings({**settings, KEY_SETTING: "k" * 43})
    codec = codec_for(signed_settings)
    job = f"signed-{uuid.uuid4().hex[:8]}"
    failed = r.AttemptFailed(
        job_id=job, ts=1, id="failed", vertex="v", subtask=0, attempt=0, host="h",
        error=r.ErrorKind.NODE_LOST, message="",
    )  # fmt: skip
    forged_event = r.AttemptFailed(
        job_id=job, ts=2, id="forged-failed", vertex="v", subtask=0, attempt=1, host="h",
        error=r.ErrorKind.NODE_LOST, message="forged",
    )  # fmt: skip
    finding = r.SlowTasksDetected(
        job_id=job, ts=3, id="detector-forged", vertex="v", speculation_safe=True,
        baseline_ms=1, baseline_ns_per_byte=None, hosts=("h",),
        slow=(r.SlowSubtask(subtask=0, live_attempts=(r.SlowAttempt(0, "h", 60_000),),
                            latest_attempt=0),),
    )  # fmt: skip
    fallback = r.FailJob(job_id=job, ts=4, id="failover-local", reason="agent's own")
    forged_command = r.FailJob(job_id=job, ts=5, id="failover-forged", reason="forged")
    producer = RecordProducer(signed_settings)
    agent = signer_for(signed_settings, AGENT)
    for record, signed in [
        (failed, True), (forged_event, False), (finding, False),
        (fallback, True), (forged_command, False),
    ]:  # fmt: skip
        topic, value = type(record).TOPIC, codec.encode(record)
        headers: Headers = list(agent.headers(topic, value)) if signed else []
        producer.send_bytes(topic, job.encode(), value, headers)
    producer.flush()
    producer.close()

    # The broker may be the session's, with services answering (the speculator launches a copy
    # for the forged finding, unsigned): what this test published is what it checks.
    sent = {failed.id, forged_event.id, finding.id, fallback.id, forged_command.id}
    read = [
        (item.topic, item.record.id)
        for topic in r.TOPICS
        for item in read_topic(signed_settings, topic, job)
        if item.record.id in sent
    ]
    assert read == [
        (r.EVENTS_TOPIC, "failed"),
        (UNAUTHENTICATED_FINDINGS_TOPIC, "detector-forged"),
        (r.COMMANDS_TOPIC, "failover-local"),
        (UNAUTHENTICATED_COMMANDS_TOPIC, "failover-forged"),
    ]
