"""The agent's start cost against the history on the decisions topics (docs/reliability.md).

A topic holding N old commands of other jobs (stamped 10 min ago) and one of the job's own,
published just after its agent's reader is created: the time from creating the reader
(`KafkaPublisher`) to that command's delivery, repeated; median and spread. Runs on its own
embedded broker. Works with the publisher before the bounded start (which read every topic from
the beginning) too, so both sides are measured by one script:

    python benchmarks/agent_start.py --history 200000 --runs 5
"""

from __future__ import annotations

import argparse
import inspect
import queue
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from tailguard.agent.adapters.kafka import KafkaPublisher
from tailguard.archive import ArchiveWriter
from tailguard.broker.embedded import EmbeddedBroker
from tailguard.codec import codec_for
from tailguard.model import records as r
from tailguard.model.config import Settings


def fill(bootstrap: str, history: int, codec: Any) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "log_level": 3})
    old = int(time.time() * 1000) - 600_000
    for n in range(history):
        job = f"old-{n % 500}"
        value = codec.encode(r.FailJob(job_id=job, ts=old, id=f"{job}-c{n}", reason="old"))
        while True:
            try:
                producer.produce(r.COMMANDS_TOPIC, value, key=job.encode(), timestamp=old)
                break
            except BufferError:
                producer.poll(0.05)
    producer.produce(r.FINDINGS_TOPIC, b"\x00", key=b"old-0", timestamp=old)  # the topic exists
    assert producer.flush(60) == 0


def one_start(settings: Settings, codec: Any, tmp: Path) -> float:
    job = f"bench-{uuid.uuid4().hex[:8]}"
    inbox: queue.Queue[Any] = queue.Queue()
    archive = ArchiveWriter(tmp / f"{job}.avro")
    bounded = "start_at_ms" in inspect.signature(KafkaPublisher).parameters
    extra: dict[str, Any] = (
        {"start_at_ms": int(time.time() * 1000) - 60_000, "on_failure": print} if bounded else {}
    )
    producer = Producer({"bootstrap.servers": settings["bootstrap.servers"], "log_level": 3})
    started = time.perf_counter()
    publisher = KafkaPublisher(archive, codec, settings, job, inbox.put, **extra)
    command = r.FailJob(job_id=job, ts=int(time.time() * 1000), id=f"{job}-c", reason="mine")
    producer.produce(r.COMMANDS_TOPIC, codec.encode(command), key=job.encode())
    producer.flush(10)
    inbox.get(timeout=600)
    elapsed = time.perf_counter() - started
    publisher.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        broker = EmbeddedBroker(Path(tmp) / "broker")
        settings = Settings({"bootstrap.servers": broker.start()})
        codec = codec_for(settings)
        try:
            fill(settings["bootstrap.servers"], args.history, codec)
            times = [one_start(settings, codec, Path(tmp)) for _ in range(args.runs)]
        finally:
            broker.stop()
    print(
        f"history {args.history}: start to own command {statistics.median(times):.3f} s median, "
        f"{min(times):.3f}-{max(times):.3f} s over {args.runs} runs"
    )


if __name__ == "__main__":
    main()
