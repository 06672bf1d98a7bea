"""Decision latency of the five services against the number of concurrent jobs (make bench-load).

The services run as `tailguard services up` runs them, on an embedded broker of their own (Apache
Kafka; `--mock`: librdkafka's mock cluster, the offline option, for the two side by side). N
simulated agents publish the event stream of a synthetic job of 1,000 tasks each (the job of
benchmarks/policy_throughput.py: four vertices in waves over 50 hosts with 2 slots, 3 of them 4x
slow, so the detector finds stragglers and the speculator and blocklist answer), paced in wall
time: one simulated second (one Tick) every `1/--speedup` s. Each job's stream is the recorded one
under its own job id. How the jobs arrive (`--arrivals`):
- `together` (the default): the N jobs start within one second and run once. Being the same
  recorded job, they reach every vertex's start at the same moment: N bursts of deployments
  at once, the worst case for the services.
- `independent`: N agents each run two jobs back to back, each agent from its own start, drawn
  uniformly (seeded) within one job's span, as jobs submitted independently to a shared cluster.
  Only decisions whose cause was sent while all N agents were mid-job count (the second span
  from the start: every agent is then in its first or second job), so N jobs are running
  throughout the measured window. Three spans of wall time per N.

Decision latency is event in -> command out: from the moment the simulated agent handed the
causing event to its producer to the moment the command (or finding) reached this harness's
consumer, following `caused_by` (a command caused by a finding is charged from the finding's
causing event). Where a record names several causes, it is charged from the *last* of them to
arrive: the decision could not be taken before it (an evidence-based block names every finding it
rests on, some minutes old, from other jobs too). "p99 1st" charges from the first cause instead:
how long the evidence took to gather, a property of the policy, not of the services. Reported per
N: records published, outputs seen, latency p50, p99 and max, p99 from the first cause, how far
the harness's own publisher fell behind, and where the p99 target (100 ms) breaks. Then, per
kind of output (a finding is the detector's; each command type is one service's), its own hop:
from its direct cause's arrival (an event's send, or a finding's arrival at this harness) to its
own arrival, which says which service holds the tail.

    make bench-load         # or: .venv/bin/python benchmarks/load.py --jobs 1,5,10,20,40 [--mock]
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from policy_throughput import Shape, SyntheticJob
from tailguard.broker.embedded import EmbeddedBroker, broker_name
from tailguard.codec import codec_for
from tailguard.kafka.consumer import RecordConsumer
from tailguard.kafka.producer import RecordProducer
from tailguard.model import records as r
from tailguard.model.config import Settings
from tailguard.model.ids import event_id
from tailguard.model.percentile import percentile
from tailguard.shell import supervisor
from tailguard.system.core_metrics import PROCESSED

TARGET_P99_MS = 100.0


def recorded_job(tasks: int, seed: int) -> list[r.Event]:
    job = SyntheticJob(Shape(tasks, hosts=50, slow_hosts=3, slots=2, seed=seed), Settings(), False)
    job.run()
    return job.recorded


def as_job(events: list[r.Event], job: str) -> list[r.Event]:
    return [
        dataclasses.replace(e, job_id=job, id=event_id(job, i)) for i, e in enumerate(events, 1)
    ]


class Outputs(threading.Thread):
    """Reads findings and commands; charges each to the send time of its first causing event."""

    def __init__(
        self,
        settings: Settings,
        jobs: set[str],
        sent: dict[str, float],
        window: tuple[float, float] = (float("-inf"), float("inf")),
    ) -> None:
        super().__init__(daemon=True)
        self.consumer = RecordConsumer(
            settings,
            codec_for(settings),
            [r.FINDINGS_TOPIC, r.COMMANDS_TOPIC],
            group_id=f"bench-load-{os.getpid()}-{time.time_ns()}",
        )
        self.jobs = jobs
        self.sent = sent
        # Only outputs whose deciding cause was sent in this window (monotonic clock) count.
        self.window = window
        self.latencies_ms: list[float] = []
        self.evidence_ms: list[float] = []
        # Each output's own hop from its direct cause (an output seen here is timed from its
        # arrival, an event from its send): (ms, wall clock at arrival, kind), the clock to set
        # the slowest beside the services' logs.
        self.arrived: dict[str, float] = {}
        self.hops: list[tuple[float, float, str]] = []
        self.outputs = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for item in self.consumer.poll(0.05):
                now = time.monotonic()
                record = item.record
                if record.job_id not in self.jobs:
                    continue
                self.outputs += 1
                caused_by = getattr(record, "caused_by", ())
                direct = [self.arrived.get(c, self.sent.get(c)) for c in caused_by]
                known = [t for t in direct if t is not None]
                causes = [self.sent[c] for c in caused_by if c in self.sent]
                counted = bool(causes) and self.window[0] <= max(causes) < self.window[1]
                if known and counted:
                    hop_ms = (now - max(known)) * 1000
                    self.hops.append((hop_ms, time.time(), type(record).__name__))
                self.arrived[record.id] = now
                if counted:
                    # A decision can be taken only once its last cause is in: that is where its
                    # latency starts. An evidence-based block names every finding it rests on,
                    # some from minutes before (other jobs' too); charging from the first one
                    # measures how long the evidence took to gather, kept apart.
                    self.latencies_ms.append((now - max(causes)) * 1000)
                    self.evidence_ms.append((now - min(causes)) * 1000)
                if causes:
                    self.sent.setdefault(record.id, max(causes))
        self.consumer.close()


Hop = tuple[int, float, float, float]  # outputs, p50, p99 and max ms


ARRIVALS = ("together", "independent")


@dataclasses.dataclass(frozen=True)
class Arrivals:
    """When each simulated job starts (s after the run's begin), and the window (s after the
    begin) in which a decision's cause must be sent for the decision to count."""

    starts: list[float]
    window: tuple[float, float]


def arrivals(kind: str, jobs: int, span_s: float, seed: int) -> Arrivals:
    if kind == "together":
        return Arrivals([j / jobs for j in range(jobs)], (float("-inf"), float("inf")))
    if kind != "independent":
        raise ValueError(f"arrivals {kind!r}: choose from {ARRIVALS}")
    draw = random.Random(seed)
    offsets = [draw.uniform(0.0, span_s) for _ in range(jobs)]
    # Each agent's second job follows its first at once; from one span on, every agent is in
    # one of them, until the second span's end.
    return Arrivals([o + k * span_s for o in offsets for k in (0, 1)], (span_s, 2 * span_s))


def run_load(
    settings: Settings,
    template: list[r.Event],
    jobs: int,
    speedup: float,
    tag: str,
    slowest_k: int = 0,
    kind: str = "together",
    seed: int = 1,
    progress: Callable[[], object] = lambda: None,
) -> tuple[dict[str, float], dict[str, Hop], list[tuple[float, float, str]]]:
    """The row of figures for `jobs` concurrent jobs arriving as `kind` says, the own hop of
    each output kind, and the `slowest_k` slowest own hops (ms, wall clock of arrival, kind).
    The row ends once no output arrived and `progress` (the services' input processed) did not
    change for 3 s."""
    t0 = template[0].ts
    span_s = (template[-1].ts - t0) / 1000 / speedup
    plan = arrivals(kind, jobs, span_s, seed)
    names = [f"load-{tag}-{jobs}-{j}" for j in range(len(plan.starts))]
    sent: dict[str, float] = {}
    begin = time.monotonic() + 1.0
    window = (begin + plan.window[0], begin + plan.window[1])
    outputs = Outputs(settings, set(names), sent, window)
    outputs.start()
    producer = RecordProducer(settings, codec_for(settings))
    # (due, job index, position): one merged schedule for every simulated agent.
    schedule = [
        (begin + start + (e.ts - t0) / 1000 / speedup, j, i)
        for j, start in enumerate(plan.starts)
        for i, e in enumerate(template)
    ]
    heapq.heapify(schedule)
    streams = [as_job(template, name) for name in names]
    late = 0.0
    while schedule:
        due, j, i = heapq.heappop(schedule)
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)  # pacing the simulated agents' clock, not synchronisation
        else:
            late = max(late, -wait)
        event = streams[j][i]
        sent[event.id] = time.monotonic()
        producer.send(event)
    producer.flush(30)
    # The last decisions: until no output arrived and no service processed input for 3 s. A
    # service behind (a loaded machine) may be silent for longer than that while it reads.
    seen: tuple[int, object] = (-1, None)
    while seen != (outputs.outputs, progress()):
        seen = (outputs.outputs, progress())
        time.sleep(3.0)
    outputs.stop.set()
    outputs.join()
    producer.close()
    lat = outputs.latencies_ms
    by_kind: dict[str, list[float]] = defaultdict(list)
    for ms, _, kind in outputs.hops:
        by_kind[kind].append(ms)
    hops = {
        kind: (len(ms), statistics.median(ms), percentile(ms, 99.0), max(ms))
        for kind, ms in sorted(by_kind.items())
    }
    slowest = sorted(outputs.hops, reverse=True)[:slowest_k]
    return (
        {
            "jobs": jobs,
            "events": len(template) * len(names),
            "outputs": outputs.outputs,
            "measured": len(lat),
            "p50": statistics.median(lat) if lat else float("nan"),
            "p99": percentile(lat, 99.0) if lat else float("nan"),
            "max": max(lat) if lat else float("nan"),
            "p99_first": percentile(outputs.evidence_ms, 99.0) if lat else float("nan"),
            "publisher_late_ms": late * 1000,
        },
        hops,
        slowest,
    )


def services_processed(work: Path) -> dict[str, float]:
    """Each running service's input records processed so far (its metrics endpoint)."""
    return {
        name: sum(v for k, v in service.metrics().items() if k.startswith(PROCESSED))
        for name, service in supervisor.running(work).items()
    }


def services_cpu_s(work: Path) -> dict[str, float]:
    """Each running service's CPU time so far (user + system, s), by name."""
    spent: dict[str, float] = {}
    for name, service in supervisor.running(work).items():
        times = psutil.Process(service.pid).cpu_times()
        spent[name] = times.user + times.system
    return spent


def clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at)) + f".{int(at % 1 * 1000):03d}"


def service_log_lines(directory: Path) -> list[str]:
    """The lines of the services' logs that may explain a stall, in time order."""
    lines = [
        line.rstrip()
        for log_file in sorted(directory.glob("*.log"))
        for line in log_file.read_text(errors="replace").splitlines()
        if "snapshot of" in line or " WARNING " in line or " ERROR " in line
    ]
    return sorted(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default="1,5,10,20,40", help="comma-separated N values")
    parser.add_argument("--tasks", type=int, default=1_000)
    parser.add_argument("--speedup", type=float, default=10.0, help="simulated s per wall s")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--arrivals",
        choices=ARRIVALS,
        default="together",
        help="together: the N jobs start within 1 s (their bursts coincide); independent: N "
        "agents, each two jobs back to back from a random start within one job's span, "
        "measured while all N run",
    )
    parser.add_argument(
        "--slowest",
        type=int,
        default=0,
        metavar="K",
        help="also list the K slowest own hops with their clock time, and the services' "
        "snapshot writes and warnings, to set side by side",
    )
    parser.add_argument(
        "--mock", action="store_true", help="librdkafka's mock cluster instead of Apache Kafka"
    )
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.jobs.split(",") if n.strip()]
    if not counts or min(counts) < 1:
        parser.error(f"--jobs needs positive job counts, not {args.jobs!r}")
    template = recorded_job(args.tasks, args.seed)
    span_s = (template[-1].ts - template[0].ts) / 1000 / args.speedup
    print(
        f"bench-load: jobs of {args.tasks:,} tasks, {len(template):,} events each over "
        f"{span_s:.0f} s wall (speedup {args.speedup:g}), arriving {args.arrivals}, on "
        f"{broker_name(args.mock)}; "
        f"load {os.getloadavg()[0]:.1f}"
    )
    print(
        f"reproduce: {sys.executable} benchmarks/load.py --jobs {args.jobs} "
        f"--tasks {args.tasks} --speedup {args.speedup:g} --seed {args.seed} "
        f"--arrivals {args.arrivals}{' --mock' if args.mock else ''}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="tailguard-load-") as tmp:
        work = Path(tmp)
        broker = EmbeddedBroker(work, mock=args.mock)
        broker.start()
        try:
            supervisor.start(work, report=lambda _: None)
            settings = Settings({"tailguard.work-dir": str(work)})
            print(
                f"{'jobs':>5} {'events':>8} {'outputs':>8} {'counted':>8} {'p50 ms':>8} "
                f"{'p99 ms':>8} "
                f"{'max ms':>8} {'p99 1st':>8} {'late ms':>8}  load"
            )
            for n in counts:
                cpu_before = services_cpu_s(work)
                row, hops, slowest = run_load(
                    settings,
                    template,
                    n,
                    args.speedup,
                    str(os.getpid()),
                    args.slowest,
                    args.arrivals,
                    args.seed,
                    lambda: services_processed(work),
                )
                verdict = "" if row["p99"] <= TARGET_P99_MS else "  <- p99 over 100 ms"
                print(
                    f"{n:>5} {row['events']:>8,.0f} {row['outputs']:>8,.0f} "
                    f"{row['measured']:>8,.0f} {row['p50']:>8.1f} "
                    f"{row['p99']:>8.1f} {row['max']:>8.1f} {row['p99_first']:>8.1f} "
                    f"{row['publisher_late_ms']:>8.0f}  "
                    f"{os.getloadavg()[0]:.1f}{verdict}",
                    flush=True,
                )
                cpu = {
                    name: spent - cpu_before.get(name, 0.0)
                    for name, spent in services_cpu_s(work).items()
                }
                # Per event the agents sent: the services' CPU for the whole row (each reads
                # the events, their findings or commands), and each service's share.
                per_event = sum(cpu.values()) / row["events"] * 1e6
                print(
                    f"      services' CPU per event sent: {per_event:.0f} µs ("
                    + ", ".join(
                        f"{name} {spent / row['events'] * 1e6:.0f}"
                        for name, spent in sorted(cpu.items())
                    )
                    + f"); load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
                for kind, (count, p50, p99, top) in hops.items():
                    print(
                        f"      own hop of {kind}: {count:,} outputs, p50 {p50:.1f} ms, "
                        f"p99 {p99:.1f} ms, max {top:.1f} ms",
                        flush=True,
                    )
                if slowest:
                    print(f"      the {len(slowest)} slowest own hops:")
                    for ms, at, kind in sorted(slowest, key=lambda s: s[1]):
                        print(f"        {clock(at)}  {ms:8.1f} ms  {kind}")
            if args.slowest:
                print("the services' snapshot writes, warnings and errors:")
                for line in service_log_lines(work / "services"):
                    print("  " + line)
        finally:
            supervisor.stop(work, report=lambda _: None)
            broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
