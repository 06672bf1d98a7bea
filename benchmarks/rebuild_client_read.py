"""How fast each Kafka client reads a topic to its end, as a service's state rebuild reads it: the
figure behind keeping librdkafka for the rebuild in a process whose stream is faust's aiokafka
(issue 26, item 5; the reason is in tailguard/shell/rebuild.py).

`--records` records of 47 bytes (the restart bench's event size) over 4 partitions, produced
once; then, `--rounds` times, read from the start to the end fixed before the read: by librdkafka
with the rebuild's own reader (`topic_scan.read_to_end`), and by aiokafka assigned the same
partitions (getmany in batches, as large fetches as the broker gives). Only the read: the
records are not decoded or fed to a core, which costs the same for both.

    .venv/bin/python benchmarks/rebuild_client_read.py --records 270000 --mock
    .venv/bin/python benchmarks/rebuild_client_read.py --records 1000000   # Apache Kafka
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, TopicPartition
from confluent_kafka import Producer

from tailguard.broker.embedded import EmbeddedBroker
from tailguard.kafka.topic_scan import read_only_consumer, read_to_end

TOPIC = "bench.rebuild-read"
PARTITIONS = 4
VALUE = b"x" * 47


def produce(bootstrap: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i in range(count):
        while True:
            try:
                producer.produce(TOPIC, value=VALUE, key=str(i % 400).encode(), partition=i % 4)
                break
            except BufferError:
                producer.poll(0.1)
    producer.flush(120)


def read_librdkafka(bootstrap: str) -> tuple[int, float]:
    consumer = read_only_consumer({"bootstrap.servers": bootstrap}, "bench-librdkafka")
    began = time.monotonic()
    read = 0
    for msg in read_to_end(consumer, TOPIC):
        msg.value()
        read += 1
    took = time.monotonic() - began
    consumer.close()
    return read, took


async def read_aiokafka(bootstrap: str) -> tuple[int, float]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id="bench-aiokafka",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=4 * 1024 * 1024,
        fetch_max_bytes=64 * 1024 * 1024,
    )
    await consumer.start()
    try:
        began = time.monotonic()
        partitions = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
        consumer.assign(partitions)
        ends = await consumer.end_offsets(partitions)
        starts = await consumer.beginning_offsets(partitions)
        for tp in partitions:
            consumer.seek(tp, starts[tp])
        left = {tp: end for tp, end in ends.items() if end > starts[tp]}
        read = 0
        while left:
            batch = await consumer.getmany(*left, timeout_ms=10_000, max_records=100_000)
            if not batch:
                raise TimeoutError(f"no record for 10 s with {left} left")
            for tp, messages in batch.items():
                end = left.get(tp)
                if end is None:
                    continue
                read += sum(1 for m in messages if m.offset < end and m.value is not None)
                if messages and messages[-1].offset + 1 >= end:
                    del left[tp]
        return read, time.monotonic() - began
    finally:
        await consumer.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=270_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--mock", action="store_true", help="librdkafka's mock broker")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        broker = EmbeddedBroker(work, mock=args.mock)
        bootstrap = broker.start()
        try:
            began = time.monotonic()
            produce(bootstrap, args.records)
            print(f"produced {args.records:,} in {time.monotonic() - began:.1f} s", flush=True)
            readers: list[tuple[str, Callable[[], tuple[int, float]]]] = [
                ("librdkafka", lambda: read_librdkafka(bootstrap)),
                ("aiokafka", lambda: asyncio.run(read_aiokafka(bootstrap))),
            ]
            for _ in range(args.rounds):
                for name, read in readers:
                    count, took = read()
                    load = os.getloadavg()[0]
                    print(f"{name:10} {count:,} records in {took:.2f} s (load {load:.1f})")
        finally:
            broker.stop(purge=True)


if __name__ == "__main__":
    main()
