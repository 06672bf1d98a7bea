"""The blocklist's snapshot against the length of its history (docs/reliability.md#bounded-restart).

For N old jobs, then the same 10 recent jobs (tests/unit/fleet_histories.py: jobs that start, run
and end, a host slow across jobs, noise, four partitions), it folds the findings through the
service's processor as a restart without a snapshot would, writes the snapshot (the core's state,
`retention.CoreState`), and restores it into a fresh processor. Printed per N: findings, their
encoded bytes (what a snapshot of every input, the former rule, would hold and fold), the fold's
time, the snapshot file's bytes, what the core holds, and the restore's time (median and range
of `--repeat` restores).

    .venv/bin/python benchmarks/blocklist_snapshot.py --old-jobs 20,200,2000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "unit"))

from fleet_histories import fleet_history, on_partitions

from tailguard.blocklist.fleet import FleetBlocklist
from tailguard.codec import codec_for
from tailguard.model.config import Settings
from tailguard.shell.processor import Processor
from tailguard.shell.snapshot import SnapshotStore
from tailguard.system.services import service_named


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old-jobs", default="20,200,2000", help="comma-separated counts")
    parser.add_argument("--repeat", type=int, default=5, help="restores timed per count")
    args = parser.parse_args()
    settings = Settings()
    codec = codec_for(settings)
    definition = service_named("blocklist")
    print("old jobs | findings | encoded bytes | fold s | snapshot bytes | held | restore ms")
    for old in (int(n) for n in args.old_jobs.split(",")):
        history = fleet_history(old, seed=5, prefix="old")
        history += fleet_history(10, seed=6, start_ms=10**11)  # past every horizon
        inputs = on_partitions(history, codec.encode)
        processor = Processor(definition, settings, codec)
        started = time.perf_counter()
        for partition, offset, raw in inputs:
            processor.replay(raw, partition, offset)
        fold_s = time.perf_counter() - started
        with tempfile.TemporaryDirectory() as work:
            store = SnapshotStore(Path(work) / "snapshot.avro")
            size = store.write(processor.snapshot())
            restores = []
            for _ in range(args.repeat):
                started = time.perf_counter()
                snapshot = store.read(definition.name, definition.input_topic)
                assert snapshot is not None
                Processor(definition, settings, codec).restore(snapshot)
                restores.append((time.perf_counter() - started) * 1000)
        core = processor.core
        assert isinstance(core, FleetBlocklist)
        print(
            f"{old} | {len(inputs)} | {sum(len(raw) for _, _, raw in inputs)} | {fold_s:.2f}"
            f" | {size} | {core.held()} | {statistics.median(restores):.1f}"
            f" ({min(restores):.1f}-{max(restores):.1f})"
        )


if __name__ == "__main__":
    main()
