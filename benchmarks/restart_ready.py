"""Restart-to-ready of a real service process with a long history on its topic (bench-restart).

`benchmarks/load_restart.py` measures the fold alone, in one process. This runs the whole
restart: an embedded broker, one service started as `tailguard services up` starts it
(`tailguard.shell.supervisor.start`: its own process, its snapshots under the work dir), and
`--history` events of finished jobs (the 1,000-task job recorded by `benchmarks/load.py`, under
one job id per copy) published through the input topic while the service consumes them and
snapshots, then `--live` jobs cut just before their first decision after their halfway point.
The feed waits on the service's committed offsets (it stays at most `FEED_AHEAD` records ahead,
so the broker's retention never drops a record the service has not read), and so does the wait
for "everything consumed".

Then, `--restarts` times: kill -9 the service; publish the next event of one live job (the one
that causes a decision); start the service again; measure from the start to `/health` 200 (as
`services up` sees it: it polls every 0.2 s) and to that decision on the service's output topic
(a record whose `caused_by` names the event: event in -> command out across the restart). The
same again `--restarts` times with the snapshot file removed before the start, so the service
rebuilds from what the broker still holds. Each start is split, from the service's JSON log, into
its rebuild (snapshot fold and tail read) and its stream start (faust's worker and the group
join, which after a kill -9 waits for the dead member's session, 6 s, to expire). The two run at
once (`tailguard.shell.worker.StateLoad`), so ready is the process's start-up plus the longer of
the two, not their sum. The first start, with no dead member, is printed for contrast.

The embedded broker is Apache Kafka (`--mock`: librdkafka's mock cluster, the offline option).
Kafka keeps a topic's records for its retention (a week for the record topics), so the restart
*without* a snapshot rebuilds from offset 0: the whole history. The mock keeps per partition at
most `max_size` = 5 MiB and `max_cnt` = 100,000 message sets (`rd_kafka_mock_partition_init`;
nothing configures them) and drops the oldest past either: with these events (~47 bytes encoded,
~79 in a batch) its 4-partition input topic holds about 270,000 of them, so there that figure is
a lower bound (the broker's low watermarks are printed). The feed stays `FEED_AHEAD` records
ahead of the service's commits on either broker, so both feed the same way.

    make bench-restart    # or: benchmarks/restart_ready.py --history 1000000 [--mock]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


from load import as_job, recorded_job
from tailguard.bench.report import spread
from tailguard.broker.embedded import EmbeddedBroker, broker_name
from tailguard.codec import codec_for
from tailguard.kafka.consumer import RecordConsumer
from tailguard.kafka.producer import RecordProducer
from tailguard.kafka.topic_scan import read_only_consumer, watermarks
from tailguard.model import records as r
from tailguard.model.config import Settings
from tailguard.shell import supervisor
from tailguard.shell.processor import Processor
from tailguard.shell.rebuild import committed_offsets
from tailguard.shell.snapshot import SnapshotStore
from tailguard.system.services import Service, service_named

# The services that read the events topic: the recorded job is their input.
EVENT_SERVICES = ("decider", "detector", "failover")
# How far the feed may run ahead of the service's committed offsets. The mock broker drops a
# partition's oldest batches past 5 MiB (66,760 of these events, measured): 20,000 ahead over
# 4 partitions never reaches that, so the service reads every record of the history there too.
FEED_AHEAD = 20_000
RECORDS_REBUILT = "tailguard_service_records_rebuilt_total"
# The worker's own line (tailguard.shell.worker.serve): the snapshot's fold and the tail's read.
REBUILT_LINE = re.compile(r"rebuilt its state in ([0-9.]+) s")
_KAFKA_TIMEOUT_S = 10.0


class BenchError(RuntimeError):
    """The benchmark cannot run as asked; the message says why."""


@dataclass(frozen=True)
class Restart:
    with_snapshot: bool
    ready_s: float  # process start -> /health 200
    decision_s: float | None  # process start -> the live event's decision out (None: not seen)
    snapshot_bytes: int
    snapshot_records: int
    reread: int  # records read from the topic after the snapshot (all of them without one)
    rebuild_s: float  # of ready_s: the snapshot's fold and the tail's read, as the service logs it
    stream_s: float  # of ready_s: faust's worker start and the group join, beside the rebuild
    load: float


def first_decision_after_half(
    definition: Service, settings: Settings, template: Sequence[r.Event]
) -> int:
    """The index of the first event at or past the job's halfway point that makes the service
    emit something, found by running the job through a fresh core (what the service will do)."""
    codec = codec_for(settings)
    core = Processor(definition, settings, codec)
    job = as_job(list(template), "probe")
    for i, event in enumerate(job):
        if core.process(codec.encode(event), 0, i) and i >= len(job) // 2:
            return i
    raise BenchError(
        f"{definition.name} decides nothing in the second half of the recorded job: "
        f"nothing to time; choose one of {', '.join(EVENT_SERVICES[:2])}"
    )


class Progress:
    """The service's committed offsets against the topic's ends, read as its group."""

    def __init__(self, settings: Settings, definition: Service) -> None:
        self.topic = definition.input_topic
        self.consumer = read_only_consumer(settings, definition.group_id)

    def watermarks(self) -> dict[int, tuple[int, int]]:
        return watermarks(self.consumer, self.topic, _KAFKA_TIMEOUT_S)

    def unread(self) -> int:
        """Records on the topic the service has not committed."""
        committed = committed_offsets(self.consumer, self.topic, _KAFKA_TIMEOUT_S)
        return sum(
            max(0, high - max(low, committed.get(p, 0)))
            for p, (low, high) in self.watermarks().items()
        )

    def wait_below(self, bound: int, timeout_s: float, alive: Callable[[], bool]) -> None:
        """Until at most `bound` records are unread (the service commits every 0.5 s: polled
        at that pace, there is no event to await across processes)."""
        deadline = time.monotonic() + timeout_s
        while (left := self.unread()) > bound:
            if not alive():
                raise BenchError("the service died while consuming; see its log")
            if time.monotonic() > deadline:
                raise BenchError(f"the service still had {left:,} records to read after "
                                 f"{timeout_s:.0f} s")  # fmt: skip
            time.sleep(0.25)

    def close(self) -> None:
        self.consumer.close()


class Bench:
    def __init__(self, work: Path, service: str, settings: Settings) -> None:
        self.work = work
        self.service = service
        self.settings = settings
        self.definition = service_named(service)
        self.codec = codec_for(settings)
        self.snapshot_path = supervisor.services_dir(work) / service / "snapshot.avro"
        self.producer = RecordProducer(settings, self.codec)
        self.progress = Progress(settings, self.definition)
        self.outputs = RecordConsumer(
            settings,
            self.codec,
            sorted({r.FINDINGS_TOPIC, r.COMMANDS_TOPIC} - {self.definition.input_topic}),
            group_id=f"bench-restart-{os.getpid()}",
            # From the beginning, not the end: a topic assigned at its end resolves that end
            # lazily, and a decision published meanwhile would be skipped.
            from_beginning=True,
        )

    def start(self, timeout_s: float = 90.0) -> float:
        """Start the service as `services up` does; seconds until it reported ready."""
        begin = time.monotonic()
        # JSON lines: the phases of a start are read back from their timestamps.
        supervisor.start(
            self.work, [self.service], timeout_s=timeout_s, report=lambda _: None, log_format="json"
        )
        return time.monotonic() - begin

    def pid(self) -> int:
        return supervisor.running(self.work)[self.service].pid

    def alive(self) -> bool:
        return self.service in supervisor.running(self.work)

    def feed(self, events: Sequence[r.Event]) -> None:
        for event in events:
            self.producer.send(event)
        self.producer.flush()

    def feed_paced(self, jobs: Iterable[list[r.Event]]) -> None:
        for job in jobs:
            self.feed(job)
            self.progress.wait_below(FEED_AHEAD, 600.0, self.alive)

    def kill(self) -> None:
        pid = self.pid()
        os.kill(pid, 9)
        os.waitpid(pid, 0)  # our child (supervisor.start launched it here): reaped, gone

    def restart(self, trigger: r.Event, with_snapshot: bool, decision_timeout_s: float) -> Restart:
        self.progress.wait_below(0, 600.0, self.alive)
        self.drain_outputs()
        self.kill()
        snapshot_bytes = snapshot_records = 0
        if with_snapshot:
            snapshot = SnapshotStore(self.snapshot_path).read(
                self.service, self.definition.input_topic
            )
            if snapshot is None:
                raise BenchError(f"{self.service} wrote no snapshot to {self.snapshot_path}")
            snapshot_bytes = self.snapshot_path.stat().st_size
            snapshot_records = len(snapshot.records)
        else:
            self.snapshot_path.unlink(missing_ok=True)
        self.feed([trigger])
        begin = time.monotonic()
        # Without a snapshot on Kafka the rebuild reads the whole history before /health says
        # ready: the decision's timeout bounds it too.
        ready_s = self.start(decision_timeout_s)
        rebuilt = int(supervisor.running(self.work)[self.service].metrics()[RECORDS_REBUILT])
        decision_s = self._decision_seen(trigger.id, begin, decision_timeout_s)
        return Restart(
            with_snapshot,
            ready_s,
            decision_s,
            snapshot_bytes,
            snapshot_records,
            rebuilt - snapshot_records,
            *self.phases(),
            os.getloadavg()[0],
        )

    def phases(self) -> tuple[float, float]:
        """The last start's rebuild (snapshot fold and tail read, as the service logs it) and
        its stream start (faust's worker and the group join: from the process's first line to
        the stream's first line), read from the service's JSON log. The two run at once (the
        worker's `StateLoad`): ready is about the process's imports plus the longer of them."""
        log_file = supervisor.services_dir(self.work) / f"{self.service}.log"
        began: datetime | None = None
        rebuilt: float | None = None
        consuming: datetime | None = None
        for line in log_file.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
                message, at = str(entry["message"]), datetime.fromisoformat(entry["time"])
            except (ValueError, KeyError, TypeError):
                continue  # a line faust wrote itself
            if message.startswith(f"{self.service} metrics on "):
                began, rebuilt, consuming = at, None, None
            elif found := REBUILT_LINE.search(message):
                rebuilt = float(found.group(1))
            elif message.startswith(f"{self.service} consuming "):
                consuming = at
        if began is None or rebuilt is None or consuming is None:
            raise BenchError(f"no rebuild or stream start of the last start in {log_file}")
        return rebuilt, (consuming - began).total_seconds()

    def drain_outputs(self) -> None:
        """Read what the service has published so far (the history's decisions, on the first
        call), so the timed wait for a decision reads only what comes after. The service has
        consumed all its input, so an empty poll means nothing more is on its way."""
        while self.outputs.poll(0.5):
            pass

    def _decision_seen(self, cause: str, begin: float, timeout_s: float) -> float | None:
        deadline = begin + timeout_s
        while time.monotonic() < deadline:
            for item in self.outputs.poll(0.05):
                if cause in getattr(item.record, "caused_by", ()):
                    return time.monotonic() - begin
        return None

    def close(self) -> None:
        self.outputs.close()
        self.progress.close()
        self.producer.close()


def _line(label: str, values: Sequence[float], unit: str = "s") -> str:
    if not values:
        return f"{label}: none"
    s = spread(values)
    return f"{label}: median {s.median:.2f} {unit}, {s.low:.2f}-{s.high:.2f} over {s.n}"


def summary(title: str, runs: Sequence[Restart]) -> list[str]:
    decided = [x.decision_s for x in runs if x.decision_s is not None]
    lines = [
        title,
        "  " + _line("start -> /health 200", [x.ready_s for x in runs]),
        "  " + _line("  of which the rebuild", [x.rebuild_s for x in runs]),
        "  " + _line("  beside it, the stream start (faust, join)", [x.stream_s for x in runs]),
        "  " + _line("start -> first decision of a live job", decided),
        f"  records re-read from the topic: {', '.join(f'{x.reread:,}' for x in runs)}",
        f"  load average: {', '.join(f'{x.load:.1f}' for x in runs)}",
    ]
    if len(decided) < len(runs):
        lines.append(f"  NO DECISION within the timeout in {len(runs) - len(decided)} restart(s)")
    if runs and runs[0].with_snapshot:
        sizes = ", ".join(f"{x.snapshot_bytes / 1e6:.2f} MB" for x in runs)
        counts = ", ".join(f"{x.snapshot_records:,}" for x in runs)
        lines.append(f"  snapshot: {sizes} ({counts} records)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history", type=int, default=1_000_000, help="events of finished jobs")
    parser.add_argument("--live", type=int, default=20, help="jobs left running")
    parser.add_argument("--restarts", type=int, default=5, help="restarts of each kind")
    parser.add_argument("--service", default="decider", choices=EVENT_SERVICES)
    parser.add_argument("--tasks", type=int, default=1_000, help="tasks of the recorded job")
    parser.add_argument("--decision-timeout", type=float, default=300.0, help="seconds")
    parser.add_argument(
        "--mock", action="store_true", help="librdkafka's mock cluster instead of Apache Kafka"
    )
    args = parser.parse_args(argv)
    if args.history < 0 or args.restarts < 1:
        parser.error("--history must be >= 0 and --restarts >= 1")
    if args.live < 2 * args.restarts:
        parser.error(
            f"--live {args.live}: each restart decides for a live job of its own, so it needs "
            f"at least 2 x --restarts = {2 * args.restarts} (with and without the snapshot)"
        )
    settings = Settings()
    template = recorded_job(args.tasks, 1)
    cut = first_decision_after_half(service_named(args.service), settings, template)
    finished = -(-args.history // len(template)) if args.history else 0
    print(
        f"bench-restart: {args.service}; {finished * len(template):,} events of {finished} "
        f"finished jobs, {args.live} live jobs of {cut:,} of their {len(template):,} events; "
        f"{args.restarts} restarts with the snapshot and {args.restarts} without; on "
        f"{broker_name(args.mock)}; load {os.getloadavg()[0]:.1f}"
    )
    print(
        f"reproduce: {sys.executable} benchmarks/restart_ready.py --history {args.history} "
        f"--live {args.live} --restarts {args.restarts} --service {args.service} "
        f"--tasks {args.tasks} --decision-timeout {args.decision_timeout:g}"
        f"{' --mock' if args.mock else ''}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="tailguard-restart-") as tmp:
        work = Path(tmp)
        broker = EmbeddedBroker(work, mock=args.mock)
        broker.start()
        bench: Bench | None = None
        try:
            bench = Bench(work, args.service, Settings({"tailguard.work-dir": str(work)}))
            first = bench.start()
            rebuild_s, stream_s = bench.phases()
            # The contrast for the restarts: a start with no killed member left in its group.
            print(
                f"first start (empty topic, no earlier member): ready {first:.2f} s (rebuild "
                f"{rebuild_s:.2f} s, stream start {stream_s:.2f} s); load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
            began = time.monotonic()
            bench.feed_paced(as_job(template, f"done-{n}") for n in range(finished))
            live = [as_job(template, f"live-{j}") for j in range(args.live)]
            bench.feed_paced([job[:cut] for job in live])
            bench.progress.wait_below(0, 600.0, bench.alive)
            ends = bench.progress.watermarks()
            held = sum(high - low for low, high in ends.values())
            produced = sum(high for _, high in ends.values())
            print(
                f"fed and consumed {produced:,} records in {time.monotonic() - began:.0f} s; "
                f"the broker still holds {held:,} of them (low watermarks "
                f"{', '.join(str(low) for low, _ in ends.values())}); "
                f"load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
            runs: list[Restart] = []
            for k in range(2 * args.restarts):
                with_snapshot = k < args.restarts
                run = bench.restart(live[k][cut], with_snapshot, args.decision_timeout)
                decided = f"{run.decision_s:.2f} s" if run.decision_s is not None else "none"
                print(
                    f"  restart {k + 1} ({'snapshot' if with_snapshot else 'no snapshot'}): "
                    f"ready {run.ready_s:.2f} s (rebuild {run.rebuild_s:.2f} s, stream start "
                    f"{run.stream_s:.2f} s), "
                    f"decision {decided}, re-read {run.reread:,}, "
                    f"load {run.load:.1f}",
                    flush=True,
                )
                runs.append(run)
            print("\n".join(summary("with the snapshot:", runs[: args.restarts])))
            dropped = produced - held
            held_note = (
                f"a lower bound: the mock broker dropped the oldest {dropped:,} records"
                if dropped
                else "the broker still held every record at this scale"
            )
            without = f"without it (rebuilt from what the broker still holds; {held_note}):"
            print("\n".join(summary(without, runs[args.restarts :])))
            return 0 if all(x.decision_s is not None for x in runs) else 1
        finally:
            if bench is not None:
                bench.close()
                # Its clients go now, not at exit: they would retry the stopped broker meanwhile.
                bench = None
            supervisor.stop(work, report=lambda _: None)
            broker.stop()


if __name__ == "__main__":
    sys.exit(main())
