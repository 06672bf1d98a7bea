"""The bench's broker, warmed before the first measured run, as a deployment's broker is.

A platform team's Kafka has been running for days when a job attaches; the bench's broker
starts minutes before its first run, and its JVM compiles its request paths (idempotent produce,
fetches woken by new data, offset commits) on first use, on the 2 cores the executors use too:
the first attached run of a bench paid for it (figures: docs/benchmarks.md, "Stack").

So before the first run the broker carries that kind of traffic once: records each in its own
request, read by as many consumer groups as read the events topic, committed as the services
commit. Plain PySpark never talks to the broker, so only the contenders that do gain, and they
gain what a running deployment has.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient

from tailguard.broker.kafka_server import create_topics
from tailguard.kafka.bootstrap import resolve_bootstrap
from tailguard.kafka.config import client_config
from tailguard.kafka.producer import RecordProducer
from tailguard.kafka.topics import TopicSpec

TOPIC = "tailguard.bench.warm-up"
# Enough requests for the JVM's compiler to settle in the experiment above (about 1,500).
RECORDS = 2_000
# As the services read the events topic: the detector, the decider, failover.
READERS = 3
VALUE = b"x" * 300  # about an event's size
DEADLINE_S = 120.0


@dataclass(frozen=True)
class WarmUp:
    records: int
    readers: int
    seconds: float


class WarmUpFailed(RuntimeError):
    """The broker did not carry the warm-up's records within the deadline."""


def warm_broker(
    settings: Mapping[str, str],
    records: int = RECORDS,
    readers: int = READERS,
    deadline_s: float = DEADLINE_S,
    clock: Callable[[], float] = time.monotonic,
) -> WarmUp:
    """Send `records` records through the broker, one request each, read by `readers` consumer
    groups that commit as they go; the topic is deleted afterwards. Raises `WarmUpFailed` if
    they have not all been read by `deadline_s`."""
    topic = f"{TOPIC}.{uuid.uuid4().hex[:8]}"  # a rerun never reads an earlier run's records
    # As tailguard's topics (4 partitions), and led by the broker before the readers start.
    create_topics(resolve_bootstrap(settings), [TopicSpec(topic)], deadline_s)
    started = clock()
    readers_: list[_Reader] = []
    try:
        readers_ += [_Reader(settings, topic, i, records) for i in range(readers)]
        for reader in readers_:  # every reader assigned before the first record
            if not reader.assigned.wait(_left(started, deadline_s, clock)):
                raise WarmUpFailed(f"no partitions of {topic} assigned in {deadline_s:g} s")
        producer = RecordProducer(settings)
        for n in range(records):
            producer.send_bytes(topic, str(n % 16).encode(), VALUE)
            producer.flush(deadline_s)  # one request per record, as the relay's events go
        for reader in readers_:
            if not reader.done.wait(_left(started, deadline_s, clock)):
                raise WarmUpFailed(
                    f"the broker's warm-up read {reader.count} of {records} records "
                    f"in {deadline_s:g} s"
                )
        return WarmUp(records, readers, clock() - started)
    finally:
        for reader in readers_:
            reader.stop()
        admin = AdminClient(client_config(settings, "producer", {}))
        for future in admin.delete_topics([topic]).values():
            future.result(timeout=deadline_s)


def _left(started: float, deadline_s: float, clock: Callable[[], float]) -> float:
    return max(0.0, deadline_s - (clock() - started))


class _Reader:
    """One consumer group reading the warm-up topic in its own thread, committing as the
    services do; `assigned` once it has partitions, `done` once it has read `records`."""

    def __init__(self, settings: Mapping[str, str], topic: str, index: int, records: int):
        self.records = records
        self.count = 0
        self.assigned = threading.Event()
        self.done = threading.Event()
        self._stop = threading.Event()
        self._consumer = Consumer(
            client_config(
                settings,
                "consumer",
                {
                    "group.id": f"tailguard-bench-warm-up-{index}",
                    "auto.offset.reset": "earliest",
                    "auto.commit.interval.ms": 500,  # as the services commit
                },
            )
        )
        self._consumer.subscribe([topic], on_assign=lambda _c, _p: self.assigned.set())
        threading.Thread(target=self._run, name=f"tg-bench-warm-{index}", daemon=True).start()

    def _run(self) -> None:
        try:
            while self.count < self.records and not self._stop.is_set():
                message = self._consumer.poll(0.1)
                if message is not None and message.error() is None:
                    self.count += 1
            if self.count >= self.records:
                self.done.set()
        finally:
            self._consumer.close()

    def stop(self) -> None:
        self._stop.set()
