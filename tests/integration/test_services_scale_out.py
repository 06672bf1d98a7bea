"""Two instances of a service in one consumer group share its topic's partitions, and when one is
killed -9 the other takes its partitions over and decides its jobs exactly as one instance would
have (issue 25, item 5; docs/services.md#scale-out).

The short case: the decider, two instances, jobs sent as events. The survivor must catch up on
what the dead instance processed (`rebuild.catch_up`) before deciding: the decisions the jobs
still need after the kill depend on the events the dead instance took. A job run on Spark across
such a failover, with replay, is tests/e2e/test_scale_out.py (long)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from test_services import committed_all, expected_decisions, job_events, poll

from tailguard.codec import codec_for
from tailguard.kafka.consumer import RecordConsumer
from tailguard.kafka.producer import RecordProducer
from tailguard.kafka.topic_scan import read_only_consumer, read_to_end, watermarks
from tailguard.kafka.topics import PARTITIONS
from tailguard.model import records as r
from tailguard.model.config import Settings
from tailguard.shell import supervisor
from tailguard.testing import Services

pytestmark = [pytest.mark.slow, pytest.mark.tailguard_services(names=["decider"])]

OWNED = "tailguard_service_partitions_owned"
REBUILT = "tailguard_service_records_rebuilt_total"


def partitions_of(services: Services, jobs: list[str], since: dict[int, int]) -> dict[str, int]:
    """job -> the events partition its records went to (written after `since`)."""
    consumer = read_only_consumer(services.settings, "scale-out-check")
    try:
        return {
            msg.key().decode(): msg.partition()
            for msg in read_to_end(consumer, r.EVENTS_TOPIC, starts=since)
            if msg.key() is not None and msg.key().decode() in jobs
        }
    finally:
        consumer.close()


def decisions_of(
    settings: Settings, wanted: dict[str, int], timeout_s: float = 60
) -> dict[str, list[r.Record]]:
    """job -> its decisions on the commands topic, read with one consumer until each job has
    `wanted[job]` distinct ones (or the time is up)."""
    consumer = RecordConsumer(
        settings, codec_for(settings), [r.COMMANDS_TOPIC], group_id=f"scale-out-{time.time_ns()}"
    )
    seen: dict[str, list[r.Record]] = {job: [] for job in wanted}
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(
            len({c.id for c in seen[job]}) < count for job, count in wanted.items()
        ):
            for consumed in consumer.poll(0.5):
                # Decisions only: the decider's announcement of its settings travels there too.
                if consumed.record.job_id in seen and isinstance(consumed.record, r.Command):
                    seen[consumed.record.job_id].append(consumed.record)
    finally:
        consumer.close()
    return seen


def owned_last(log: Path) -> set[int]:
    """The partitions an instance said it owned last (its log's `owns ... partitions` lines)."""
    lines = re.findall(r"owns tailguard\.events partitions \[([0-9, ]*)\]", log.read_text())
    assert lines, f"{log} says no assignment"
    return {int(p) for p in lines[-1].split(",") if p.strip()}


def test_the_survivor_takes_over_and_decides_as_one_instance(
    tailguard_services: Services,
) -> None:
    both = tailguard_services.start(["decider"], instances=2)
    assert sorted(both) == ["decider", "decider-2"]
    try:
        takes_over(tailguard_services, both)
    finally:
        supervisor.stop(tailguard_services.work_dir, ["decider-2"], report=lambda _: None)


def takes_over(tailguard_services: Services, both: dict[str, Any]) -> None:
    settings = tailguard_services.settings
    # The group has settled when the two own every partition between them, each some.
    poll(
        lambda: sorted(s.metrics()[OWNED] for s in both.values()) == [PARTITIONS // 2] * 2,
        60,
        "the two instances to share the partitions",
    )
    consumer = read_only_consumer(settings, "scale-out-check")
    since = {p: high for p, (_, high) in watermarks(consumer, r.EVENTS_TOPIC, 10).items()}
    consumer.close()

    run = f"{time.time_ns()}"
    jobs = [f"scale-{run}-{n}" for n in range(12)]
    events = {job: job_events(job) for job in jobs}
    producer = RecordProducer(settings, codec_for(settings))
    for job in jobs:
        for event in events[job][:-1]:  # the last one decides agg, from the ones before
            producer.send(event)
    producer.flush(10)
    first = decisions_of(settings, dict.fromkeys(jobs, 1))
    assert all(first.values()), f"no first decision: {[j for j, got in first.items() if not got]}"
    poll(lambda: committed_all(settings, "decider"), 30, "the group's commits")

    victim = "decider-2"
    lost = owned_last(tailguard_services.work_dir / "services" / f"{victim}.log")
    placed = partitions_of(tailguard_services, jobs, since)
    moved = [job for job in jobs if placed[job] in lost]
    assert moved, f"no job on {victim}'s partitions {sorted(lost)}: {placed}"
    survivor = both["decider"]
    rebuilt_before = survivor.metrics()[REBUILT]

    tailguard_services.kill(victim)
    for job in jobs:
        producer.send(events[job][-1])
    producer.flush(10)

    expected = {job: expected_decisions(events[job]) for job in jobs}
    decided = decisions_of(settings, {job: len(expected[job]) for job in jobs})
    for job in jobs:
        by_id: dict[str, r.Record] = {}
        for command in decided[job]:
            # At least once: a decision sent again must be the same, under the same id.
            assert by_id.setdefault(command.id, command) == command
        assert list(by_id.values()) == expected[job], f"{job} (moved: {job in moved})"
    poll(lambda: survivor.metrics()[OWNED] == PARTITIONS, 30, "the survivor to own them all")
    # It fed the moved jobs' events to its core before deciding for them (not one of them was
    # its own before the kill).
    caught_up = survivor.metrics()[REBUILT] - rebuilt_before
    assert caught_up >= sum(len(events[job]) - 1 for job in moved)
