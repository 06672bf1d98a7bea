"""Log throughput and latency on the embedded broker: Apache Kafka, or with `--mock` librdkafka's
mock cluster (the offline option), for the figures of both side by side.

Starts its own embedded broker, then:
1. produces N encoded events (an AttemptFinished / Tick mix over ~50 jobs) as fast as it can
   and consumes and decodes them, timing each side: on Kafka all of them, then all of them
   back; on the mock in rounds (see `throughput`);
2. produces at a paced rate (default 5,000 events/s for 10 s) while a consumer reads, and reports
   the produce-to-consume latency percentiles.

Targets: > 50,000 events/s each way; p99 latency < 50 ms at 5,000 events/s.

Reproduce: make bench-log   (or: .venv/bin/python benchmarks/log_throughput.py [--mock])
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator

from tqdm import tqdm

from tailguard.broker.embedded import EmbeddedBroker
from tailguard.codec import RecordCodec, codec_for
from tailguard.kafka.consumer import RecordConsumer
from tailguard.kafka.producer import RecordProducer
from tailguard.model.config import Settings
from tailguard.model.percentile import percentile
from tailguard.model.records import AttemptFinished, Record, Tick

REPRODUCE = ".venv/bin/python benchmarks/log_throughput.py"  # `make bench-log`: on Kafka
# The mock keeps the newest ~5 MiB of each partition (rd_kafka_mock_partition_init): producing
# everything before consuming would lose the oldest records, so it is timed in rounds of this.
MOCK_CHUNK = 20_000


def workload(n: int, jobs: int, seed: int = 7) -> Iterator[Record]:
    """A realistic stream: mostly finished attempts with per-subpartition sizes and checksums,
    and the agent's periodic Ticks, interleaved over `jobs` concurrent jobs."""
    rng = random.Random(seed)
    sequence = [0] * jobs
    for i in range(n):
        j = rng.randrange(jobs)
        job = f"job-{j:03d}"
        sequence[j] += 1
        seq = sequence[j]
        ts = 1_700_000_000_000 + i
        if rng.random() < 0.3:
            yield Tick(job_id=job, ts=ts, id=f"{job}-e{seq}")
            continue
        subpartitions = rng.choice((8, 16, 32))
        yield AttemptFinished(
            job_id=job,
            ts=ts,
            id=f"{job}-e{seq}",
            vertex=rng.choice(("source", "parse", "join", "aggregate", "sink")),
            subtask=rng.randrange(128),
            attempt=rng.randrange(3),
            host=f"127.0.0.{rng.randrange(2, 10)}",
            input_bytes=rng.randrange(1 << 20, 1 << 28),
            records=rng.randrange(1_000, 1_000_000),
            bytes_per_subpartition=tuple(rng.randrange(1 << 24) for _ in range(subpartitions)),
            checksums=tuple(f"{rng.getrandbits(64):016x}" for _ in range(subpartitions)),
        )


@dataclasses.dataclass
class Side:
    """Time spent on one side (produce or consume): wall clock, and CPU of this process (all
    its threads, librdkafka's included), which other load on the machine barely changes."""

    wall_s: float = 0.0
    cpu_s: float = 0.0

    def rates(self, events: int) -> str:
        return (
            f"{events / self.wall_s:>10,.0f} events/s "
            f"({events / self.cpu_s:,.0f} per CPU-second of this process)"
        )


class Timed:
    def __init__(self, side: Side) -> None:
        self.side = side

    def __enter__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def __exit__(self, *exc: object) -> None:
        self.side.wall_s += time.perf_counter() - self.wall
        self.side.cpu_s += time.process_time() - self.cpu


def throughput(
    settings: Settings, codec: RecordCodec, topic: str, records: list[Record], chunk: int
) -> tuple[Side, Side]:
    """Time producing and consuming all records, in rounds of `chunk`: produce a round, then
    consume it (one round of everything on Kafka; `MOCK_CHUNK` on the mock broker)."""
    producer = RecordProducer(settings, codec)
    consumer = RecordConsumer(settings, codec, [topic], f"bench-{uuid.uuid4().hex}")
    produce, consume = Side(), Side()
    consumed = 0
    with (
        tqdm(total=len(records), desc="produce", unit="ev", mininterval=0.5) as produced_bar,
        tqdm(total=len(records), desc="consume", unit="ev", mininterval=0.5) as consumed_bar,
    ):
        for first in range(0, len(records), chunk):
            batch = records[first : first + chunk]
            with Timed(produce):
                for record in batch:
                    producer.send(record, topic)
                producer.flush(60)
            produced_bar.update(len(batch))

            target = first + len(batch)
            deadline = time.monotonic() + 120
            with Timed(consume):
                while consumed < target and time.monotonic() < deadline:
                    got = len(consumer.poll(0.5))
                    consumed += got
                    consumed_bar.update(got)
            if consumed < target:
                raise SystemExit(f"consumed only {consumed} of {target} events")
    consumer.close()
    return produce, consume


def paced_latency(
    settings: Settings, codec: RecordCodec, topic: str, records: list[Record], rate: float
) -> list[float]:
    """Latencies (ms) from handing a record to the producer to its decoded arrival.

    Producer and consumer share this process (a thread each), as the agent's do; the two
    sides' clocks are the same `perf_counter`."""
    sent_at: dict[str, float] = {}
    latencies: list[float] = []
    consumer = RecordConsumer(settings, codec, [topic], f"bench-{uuid.uuid4().hex}")
    producer = RecordProducer(settings, codec)
    # Create the topic and let the consumer find it before the clock starts: a warm-up record.
    warm_up = dataclasses.replace(records[0], id="warm-up")
    producer.send(warm_up, topic)
    producer.flush(10)
    deadline = time.monotonic() + 30
    while not consumer.poll(0.1) and time.monotonic() < deadline:
        pass
    done = threading.Event()

    def consume() -> None:
        while len(latencies) < len(records) and not done.is_set():
            for c in consumer.poll(0.1):
                arrived = time.perf_counter()
                latencies.append((arrived - sent_at[c.record.id]) * 1000)

    reader = threading.Thread(target=consume, name="bench-consumer")
    reader.start()
    try:
        start = time.perf_counter()
        for i, record in enumerate(tqdm(records, desc=f"paced {rate:.0f}/s", unit="ev")):
            due = start + i / rate
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)  # pacing the load, not synchronising
            sent_at[record.id] = time.perf_counter()
            producer.send(record, topic)
        producer.flush(30)
        reader.join(timeout=30)
    finally:
        done.set()
        reader.join()
        consumer.close()
    return latencies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument(
        "--chunk",
        type=int,
        default=None,
        help=f"events per produce-then-consume round (default: all on Kafka, {MOCK_CHUNK:,} on "
        "the mock, which keeps only ~5 MiB per partition)",
    )
    parser.add_argument(
        "--mock", action="store_true", help="librdkafka's mock cluster instead of Apache Kafka"
    )
    parser.add_argument("--rate", type=float, default=5_000.0, help="paced run, events/s")
    parser.add_argument("--seconds", type=float, default=10.0, help="paced run length")
    args = parser.parse_args()
    if args.chunk is None:
        args.chunk = MOCK_CHUNK if args.mock else args.events
    if min(args.events, args.chunk) < 1 or args.rate <= 0 or args.seconds <= 0:
        parser.error("--events and --chunk must be at least 1, --rate and --seconds above 0")
    chunk = min(args.chunk, args.events)

    # Other work on the machine skews every figure here; the load is printed with the results.
    load_at_start = os.getloadavg()[0]
    work_dir = tempfile.mkdtemp(prefix="tailguard-bench-log-")
    broker = EmbeddedBroker(work_dir, mock=args.mock)
    bootstrap = broker.start()
    print(f"embedded broker, {broker.name}, at {bootstrap} (work dir {work_dir})")
    try:
        settings = Settings({"bootstrap.servers": bootstrap})
        codec = codec_for(settings)
        records = list(workload(args.events, args.jobs))
        sizes = [len(codec.encode(r)) for r in records[:2000]]
        print(
            f"{len(records):,} events over {args.jobs} jobs, "
            f"mean encoded size {statistics.mean(sizes):.0f} B"
        )
        topic = f"bench.events.{uuid.uuid4().hex[:8]}"
        produce, consume = throughput(settings, codec, topic, records, chunk)

        # Fresh ids: latencies are matched by id.
        paced = [
            dataclasses.replace(r, id=f"paced-{i}")
            for i, r in enumerate(records[: int(args.rate * args.seconds)])
        ]
        latencies = paced_latency(
            settings, codec, f"bench.paced.{uuid.uuid4().hex[:8]}", paced, args.rate
        )
    finally:
        broker.stop(purge=True)

    print()
    load = os.getloadavg()[0]
    print(
        f"machine: {os.cpu_count()} CPUs, 1-min load average {load:.1f} "
        f"(at start {load_at_start:.1f}); broker: {broker.name}; rounds of {chunk:,} events"
    )
    if len(latencies) < len(paced):
        print(f"warning: only {len(latencies):,} of {len(paced):,} paced events arrived")
    print(f"produce (encode + send + flush): {produce.rates(len(records))}  (target > 50,000/s)")
    print(f"consume (fetch + decode):        {consume.rates(len(records))}  (target > 50,000/s)")
    print(
        f"latency at {args.rate:,.0f} events/s over {len(latencies):,} events: "
        f"p50 {percentile(latencies, 50):.1f} ms, p99 {percentile(latencies, 99):.1f} ms, "
        f"max {max(latencies):.1f} ms  (target p99 < 50 ms)"
    )
    print(f"reproduce: {REPRODUCE}{' --mock' if args.mock else ''}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
