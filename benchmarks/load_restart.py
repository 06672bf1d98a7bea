"""Restart cost of a service with 1 million events of history (docs/reliability.md).

The decider's input: `--history` events of finished jobs (the 1,000-task job of
benchmarks/policy_throughput.py under many job ids), then `--live` jobs halfway through. Measured
in one process, without the broker (the fold is what grows with history; reading the topic adds
the broker's own cost on top):

- from offset 0: every record folded into a fresh core, as a service without a snapshot does;
- from a snapshot: the snapshot the live service would have written at that point read from its
  file and folded (only the live jobs' records are in it), as a restart does before the tail.

    .venv/bin/python benchmarks/load_restart.py --history 1000000 --live 20
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from load import as_job, recorded_job
from tailguard.codec import codec_for
from tailguard.model.config import Settings
from tailguard.shell.processor import Processor
from tailguard.shell.snapshot import SnapshotStore
from tailguard.system.services import service_named


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history", type=int, default=1_000_000)
    parser.add_argument("--live", type=int, default=20)
    parser.add_argument("--service", default="decider")
    args = parser.parse_args(argv)
    settings = Settings()
    codec = codec_for(settings)
    definition = service_named(args.service)
    template = recorded_job(1_000, 1)
    inputs: list[bytes] = []
    n = 0
    while len(inputs) < args.history:
        inputs += [codec.encode(e) for e in as_job(template, f"done-{n}")]
        n += 1
    for j in range(args.live):
        inputs += [codec.encode(e) for e in as_job(template, f"live-{j}")[: len(template) // 2]]
    print(
        f"restart cost: {args.service}, {len(inputs):,} records ({n} finished jobs, "
        f"{args.live} live halfway); load {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    live = Processor(definition, settings, codec)
    started = time.perf_counter()
    for offset, raw in enumerate(inputs):
        live.process(raw, 0, offset)
    print(f"processed live once (outputs encoded, not sent): {time.perf_counter() - started:.1f} s")

    cold = Processor(definition, settings, codec)
    started = time.perf_counter()
    for offset, raw in enumerate(inputs):
        cold.replay(raw, 0, offset)
    full = time.perf_counter() - started
    print(f"from offset 0: {full:.1f} s ({len(inputs) / full:,.0f} records/s)")

    with tempfile.TemporaryDirectory() as tmp:
        store = SnapshotStore(Path(tmp) / "snapshot.avro")
        started = time.perf_counter()
        size = store.write(live.snapshot())
        wrote = time.perf_counter() - started
        started = time.perf_counter()
        snapshot = store.read(definition.name, definition.input_topic)
        assert snapshot is not None
        warm = Processor(definition, settings, codec)
        folded = warm.restore(snapshot)
        restore = time.perf_counter() - started
    print(
        f"from a snapshot: {restore:.2f} s to read and fold {folded:,} records "
        f"({size / 1e6:.1f} MB file, written in {wrote:.2f} s); load {os.getloadavg()[0]:.1f}"
    )
    same = warm.core.metrics().get("jobs_active") == cold.core.metrics().get("jobs_active")
    print(f"same live jobs in both: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
