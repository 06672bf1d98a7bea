"""The services as separate processes on the embedded broker: decisions, dead letters, metrics,
and a kill -9 in the middle of a job that changes no decision."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from tailguard.codec import codec_for
from tailguard.decider.policy import ParallelismDecider
from tailguard.kafka.consumer import RecordConsumer
from tailguard.kafka.dead_letters import DeadLetterReader
from tailguard.kafka.producer import RecordProducer
from tailguard.model import records as r
from tailguard.model.config import Settings
from tailguard.testing import Services

# The plugin's embedded broker and the decider alone, started by the `tailguard_services`
# fixture (and started again if a test left it dead).
pytestmark = [pytest.mark.slow, pytest.mark.tailguard_services(names=["decider"])]


def poll(condition: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (result := condition()):
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)
    return result


def committed_all(settings: Settings, service: str) -> bool:
    """Whether the service's group has committed every record on the events topic."""
    from tailguard.kafka.topic_scan import read_only_consumer, watermarks
    from tailguard.shell.rebuild import committed_offsets
    from tailguard.system.services import service_named

    consumer = read_only_consumer(settings, service_named(service).group_id)
    try:
        done = committed_offsets(consumer, r.EVENTS_TOPIC, 5.0)
        ends = watermarks(consumer, r.EVENTS_TOPIC, 5.0)
        return all(done.get(p, 0) >= end for p, (_, end) in ends.items())
    finally:
        consumer.close()


def graph() -> r.JobGraphSpec:
    def vertex(name: str, kind: r.VertexKind, splits: tuple[int, ...] = ()) -> r.VertexSpec:
        return r.VertexSpec(
            name=name,
            kind=kind,
            parallelism=None,
            max_parallelism=8,
            speculation_safe=True,
            split_bytes=splits,
        )

    return r.JobGraphSpec(
        vertices=(
            vertex("src", r.VertexKind.SOURCE, (20 << 20,) * 3),
            vertex("agg", r.VertexKind.OPERATOR),
            vertex("sink", r.VertexKind.SINK),
        ),
        edges=(
            r.EdgeSpec("src", "agg", r.Distribution.ALL_TO_ALL, r.Exchange.BLOCKING, 0),
            r.EdgeSpec("agg", "sink", r.Distribution.FORWARD, r.Exchange.BLOCKING, 0),
        ),
    )


def job_events(job: str) -> list[r.Event]:
    """A job whose source is decided at submission and whose `agg` is decided once the three
    source subtasks have finished."""
    seq = iter(range(1, 1000))

    def ids() -> dict[str, Any]:
        n = next(seq)
        return {"job_id": job, "ts": 1_000 + n, "id": f"{job}-e{n}"}

    events: list[r.Event] = [r.JobSubmitted(**ids(), name=job, graph=graph(), config={})]
    ranges = tuple(
        r.SubtaskInputs(i, (r.InputRange(r.SPLITS_INPUT, i, i, 0, 0),)) for i in range(3)
    )
    events.append(
        r.VertexInitialized(
            **ids(), vertex="src", parallelism=3, subtask_inputs=ranges, decided_by="decider"
        )
    )
    for i in range(3):
        events.append(r.AttemptDeploying(**ids(), vertex="src", subtask=i, attempt=0, host="h1"))
    for i in range(3):
        sizes = tuple((i + 1) * (1 << 20) + s * 4096 for s in range(8))
        events.append(
            r.AttemptFinished(
                **ids(),
                vertex="src",
                subtask=i,
                attempt=0,
                host="h1",
                input_bytes=20 << 20,
                records=1000,
                bytes_per_subpartition=sizes,
                checksums=tuple("c" * 8 for _ in sizes),
            )
        )
    return events


def expected_decisions(events: list[r.Event]) -> list[r.Record]:
    core = ParallelismDecider(Settings())
    return [out for e in events for out in core.handle(e)]


def commands_of(settings: Settings, job: str, count: int, timeout_s: float = 30) -> list[r.Record]:
    consumer = RecordConsumer(
        settings, codec_for(settings), [r.COMMANDS_TOPIC], group_id=f"check-{job}-{time.time()}"
    )
    seen: list[r.Record] = []
    try:
        deadline = time.monotonic() + timeout_s
        while len({c.id for c in seen}) < count and time.monotonic() < deadline:
            # Decisions only: the decider's announcement of its settings travels there too.
            seen += [
                c.record
                for c in consumer.poll(0.5)
                if c.record.job_id == job and isinstance(c.record, r.Command)
            ]
    finally:
        consumer.close()
    return seen


def test_decider_service_decides_dead_letters_and_reports(tailguard_services: Services) -> None:
    settings = tailguard_services.settings
    services = tailguard_services.running()
    producer = RecordProducer(settings, codec_for(settings))
    events = job_events("job-a")
    producer.send(events[0])
    producer.send_bytes(r.EVENTS_TOPIC, b"job-a", b"\x00not an avro record")
    for event in events[1:]:
        producer.send(event)
    producer.flush(10)

    expected = expected_decisions(events)
    assert len(expected) == 2  # the source at submission, agg when its inputs finished
    got = commands_of(settings, "job-a", len(expected))
    assert list({c.id: c for c in got}.values()) == expected

    # The broker is the session's: other modules' dead letters may be on the topic too.
    with DeadLetterReader(settings, r.EVENTS_TOPIC) as reader:
        letters = poll(
            lambda: [d for d in reader.poll(0.5) if d.key == b"job-a"], 20, "job-a's dead letter"
        )
    assert [(d.topic, d.value) for d in letters] == [(r.EVENTS_TOPIC, b"\x00not an avro record")]
    assert letters[0].error  # names what was wrong

    processed = "tailguard_service_records_processed_total"
    metrics = poll(
        lambda: (m := services["decider"].metrics())[processed] >= len(events) + 1 and m,
        20,
        "the decider's metrics to count every record",
    )
    assert metrics["tailguard_service_dead_letters_total"] >= 1
    assert metrics['tailguard_service_records_emitted_total{record="SetParallelism"}'] >= 2
    # Both decisions were answered live: their latency from the input record's timestamp.
    assert metrics["tailguard_service_decision_latency_seconds_count"] >= 2


def test_kill_9_mid_job_changes_no_decision(tailguard_services: Services) -> None:
    settings = tailguard_services.settings
    tailguard_services.restart("decider")
    producer = RecordProducer(settings, codec_for(settings))
    events = job_events("job-b")
    first, rest = events[:-1], events[-1:]  # agg is decided only by the last event
    for event in first:
        producer.send(event)
    producer.flush(10)
    poll(
        lambda: len(commands_of(settings, "job-b", 1, timeout_s=2)) >= 1, 30, "the source decision"
    )
    rebuilt = "tailguard_service_records_rebuilt_total"
    # Killed once its group has committed everything on the topic (commits come every second):
    # before that, the restart would take job-b's events live again, not rebuild them.
    poll(lambda: committed_all(settings, "decider"), 30, "the decider's commit")

    tailguard_services.kill("decider")  # SIGKILL, and back once it is gone
    restarted = tailguard_services.start(["decider"])
    # Its state went back in: job-b's events, from the snapshot and the topic's tail (finished
    # jobs' events are no longer read, so the count can be below the previous start's).
    assert restarted["decider"].metrics()[rebuilt] >= len(first)

    for event in rest:
        producer.send(event)
    producer.flush(10)
    expected = expected_decisions(events)
    got = commands_of(settings, "job-b", len(expected))
    by_id: dict[str, r.Record] = {}
    for command in got:
        # At least once: a re-emitted decision must be identical, under the same id.
        assert by_id.setdefault(command.id, command) == command
    assert list(by_id.values()) == expected
