"""How soon a job's agent receives its first decisions on Apache Kafka.

    .venv/bin/python benchmarks/decision_reader_start.py [--trials 3]

Starts the embedded broker (Apache Kafka) in a work dir of its own, then per trial makes the
agent's Kafka publisher as `tailguard.run` does (its decision reader starts reading a minute
before now) and sends three commands for its job, 0.3 s, 1 s and 2 s after the publisher was
made, printing how long each took to reach the agent. A job's first attempt waits for the
decider's first command (the source's parallelism), so this is part of every job's start: before
aa4a63b the first command arrived 1.7-2.2 s after it was sent, the reader's offset lookups for
its second topic queued behind fetches of its first (docs/configuration.md, the fetch wait).
Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import queue
import shlex
import sys
import tempfile
import time
from pathlib import Path

from tailguard.agent.adapters.kafka import KafkaPublisher
from tailguard.archive import ArchiveWriter
from tailguard.broker.embedded import EmbeddedBroker
from tailguard.codec.factory import codec_for
from tailguard.kafka.producer import RecordProducer
from tailguard.model import records as r
from tailguard.model.config import Settings

SEND_AT_S = (0.3, 1.0, 2.0)


def trial(settings: Settings, scratch: Path, n: int) -> list[float]:
    """The delivery time (s) of each command, sent SEND_AT_S after the publisher was made."""
    job = f"reader-start-{n}-{time.time_ns()}"
    got: queue.Queue[tuple[float, str]] = queue.Queue()
    codec = codec_for(settings)
    made = time.perf_counter()
    publisher = KafkaPublisher(
        ArchiveWriter(scratch / f"{job}.avro"),
        codec,
        settings,
        job,
        lambda c: got.put((time.perf_counter(), c.command.id)),
        start_at_ms=int(time.time() * 1000) - 60_000,
        on_failure=lambda err: print(f"the decision reader died: {err!r}", file=sys.stderr),
    )
    producer = RecordProducer(settings, codec)
    sent: dict[str, float] = {}
    try:
        for k, at in enumerate(SEND_AT_S):
            time.sleep(max(0.0, made + at - time.perf_counter()))
            command = r.FailJob(job_id=job, ts=int(time.time() * 1000), id=f"c{k}", reason="probe")
            sent[command.id] = time.perf_counter()
            producer.send(command)
            producer.flush(5)
        delays: dict[str, float] = {}
        while len(delays) < len(sent):
            arrived, command_id = got.get(timeout=30)
            delays[command_id] = arrived - sent[command_id]
        return [delays[f"c{k}"] for k in range(len(SEND_AT_S))]
    finally:
        publisher.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker(Path(tmp) / "broker") as bootstrap:
        settings = Settings({"bootstrap.servers": bootstrap})
        for n in range(args.trials):
            delays = trial(settings, Path(tmp), n)
            shown = ", ".join(
                f"sent {at:g} s after: {d * 1000:.0f} ms"
                for at, d in zip(SEND_AT_S, delays, strict=True)
            )
            print(f"trial {n + 1}: {shown}")
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}, {os.cpu_count()} cores")
    print(f"reproduce: {shlex.join([sys.executable, *sys.argv])}")


if __name__ == "__main__":
    main()
