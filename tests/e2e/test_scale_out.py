"""The services scaled out, with jobs on Spark across a failover (issue 25, item 5): two
instances of each service that scales out, in one consumer group each; the sales job on Spark
`local[2]`; mid-job, the instance of each events reader (detector, decider, failover) that owns
the job's partition killed -9. The survivors take the partitions over, catch up on the job's
events and decide for it: the output is exact, no command is applied twice, every partition is
the survivor's, and the job's archive replays with 0 differences; so does the next job's, run
on the survivors alone.

Minutes (the services' starts, two jobs, the group's session timeout): `make test-long`. Its
short case in `make test` is tests/integration/test_services_scale_out.py (the decider's two
instances, jobs sent as events)."""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from tailguard.agent.driver.hooks import JobHooks
from tailguard.examples import sales_by_region as example
from tailguard.kafka.config import client_config
from tailguard.kafka.topic_scan import read_only_consumer, read_to_end, watermarks
from tailguard.kafka.topics import PARTITIONS
from tailguard.model import records as r
from tailguard.shell import supervisor
from tailguard.system.services import SERVICES
from tailguard.testing import (
    Harness,
    JobRun,
    Services,
    assert_output_equals,
    assert_replay_clean,
    assert_succeeded,
    run_job,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.long, pytest.mark.tailguard_services]

HEAD = "sales→score→partial"
OWNED = "tailguard_service_partitions_owned"
REBUILT = "tailguard_service_records_rebuilt_total"
SCALED = [s.name for s in SERVICES if s.scales_out]
EVENTS_READERS = [s.name for s in SERVICES if s.scales_out and s.input_topic == r.EVENTS_TOPIC]


def poll(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)  # the services' metrics over HTTP: nothing to wait on but a poll


def owned_last(services: Services, instance: str) -> set[int]:
    """The partitions an instance said it owned last (its log's `owns ... partitions`)."""
    log = services.work_dir / "services" / f"{instance}.log"
    lines = re.findall(r"owns tailguard\.\w+ partitions \[([0-9, ]*)\]", log.read_text())
    assert lines, f"{log} says no assignment"
    return {int(p) for p in lines[-1].split(",") if p.strip()}


def partition_of(services: Services, job_id: str, since: dict[int, int]) -> int:
    consumer = read_only_consumer(services.settings, "scale-out-e2e")
    try:
        for msg in read_to_end(consumer, r.EVENTS_TOPIC, starts=since):
            if msg.key() == job_id.encode():
                return int(msg.partition() or 0)
    finally:
        consumer.close()
    raise AssertionError(f"no event of {job_id} on {r.EVENTS_TOPIC}")


def probe(services: Services, partition: int) -> None:
    """A record that does not decode, on `partition` of the events topic: the stream hands it to
    each owner (which files it as a dead letter), so each must first catch up on that partition.
    The catch-up is lazy: an owner whose partition gets no record after its takeover (the job
    had ended) has had nothing to decide for it yet."""
    producer = Producer(client_config(services.settings, "producer", {}))
    producer.produce(r.EVENTS_TOPIC, b"not a record", b"scale-out-probe", partition=partition)
    assert producer.flush(30) == 0


@pytest.fixture
def two_each(tailguard_services: Services) -> Iterator[Services]:
    """Two instances of each service that scales out, settled: each owns half the partitions."""
    started = tailguard_services.start(instances=2)
    for name in SCALED:
        pair = [s for s in started.values() if s.service == name]
        assert len(pair) == 2, started
        poll(
            lambda pair=pair: [s.metrics()[OWNED] for s in pair] == [PARTITIONS // 2] * 2,
            90,
            f"{name}'s instances to share the partitions",
        )
    yield tailguard_services
    # As the module found them: one instance of each (the first started again if it was the
    # one killed), the others stopped.
    tailguard_services.start()
    extra = [
        n for n, s in supervisor.running(tailguard_services.work_dir).items() if n != s.service
    ]
    supervisor.stop(tailguard_services.work_dir, extra, report=lambda _: None)


def run(services: Services, spark: Any, data: Path, work: Path, hooks: JobHooks) -> JobRun:
    out = work / "out"
    job = example.make_job(data, out, name=work.name)
    job_run = run_job(job, spark, work, services=services, hooks=hooks)
    assert_succeeded(job_run)
    assert_output_equals(job_run, example.reference(data), ignore_order=True)
    applied = Counter(e.command_id for e in job_run.records if isinstance(e, r.CommandApplied))
    assert not applied or max(applied.values()) == 1, "a command id was applied twice"
    assert_replay_clean(job_run)
    return job_run


def test_a_job_across_a_failover_and_the_next_replay_exactly(
    two_each: Services, tailguard_harness: Harness, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    services = two_each
    spark = tailguard_harness.local_spark_of(request.node)
    data = example.generate(tmp_path / "data", files=4, rows_per_file=3_000)
    consumer = read_only_consumer(services.settings, "scale-out-e2e")
    since = {p: high for p, (_, high) in watermarks(consumer, r.EVENTS_TOPIC, 10).items()}
    consumer.close()
    rebuilt = {name: s.metrics()[REBUILT] for name, s in services.running().items()}

    killed: dict[str, str] = {}  # service -> the instance killed
    done = threading.Event()
    failed: list[BaseException] = []

    def kill_owners(job_id: str) -> None:
        try:
            partition = partition_of(services, job_id, since)
            for name in EVENTS_READERS:
                instances = [n for n, s in services.running().items() if s.service == name]
                owner = next(n for n in instances if partition in owned_last(services, n))
                services.kill(owner)
                killed[name] = owner
        except BaseException as err:  # told to the test's thread below
            failed.append(err)
        finally:
            done.set()

    job_id: list[str] = []

    def on_event(event: r.Event) -> None:
        if isinstance(event, r.AttemptFinished) and event.vertex == HEAD and not killed:
            job_id.append(event.job_id)
            killed["-"] = "pending"
            threading.Thread(target=kill_owners, args=(event.job_id,), daemon=True).start()

    run(services, spark, data, tmp_path / "across", JobHooks(on_event=on_event))
    assert done.wait(60) and not failed, failed
    killed.pop("-")
    assert sorted(killed) == sorted(EVENTS_READERS), killed

    probe(services, partition_of(services, job_id[0], since))
    running = services.running()
    for name, victim in killed.items():
        assert victim not in running, f"{victim} is running again"
        survivor = next(s for s in running.values() if s.service == name)
        poll(lambda s=survivor: s.metrics()[OWNED] == PARTITIONS, 60, f"{survivor.name} to own all")
        # Before the probe's dead letter, it fed its core the job's events, which the killed
        # instance had processed: its own state stopped before the job (it started before).
        poll(
            lambda s=survivor: s.metrics()[REBUILT] > rebuilt[s.name],
            60,
            f"{survivor.name} to catch up on the job's partition",
        )

    run(services, spark, data, tmp_path / "after", JobHooks())
