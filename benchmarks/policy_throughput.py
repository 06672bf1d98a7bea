"""Throughput of the speculation policies: detector -> speculator -> blocklist in one process.

A synthetic job of 100,000 tasks in four vertices (source -> map -> aggregate -> sink, each
consuming its producer's outputs through subpartition ranges) runs in waves over 1,000 hosts
with 2 slots each, a few of which are 4x slower. Time is simulated: a Tick every simulated
second, task times from their input bytes and their host's speed. Every event goes through the
detector, every finding through the speculator and the blocklist, and their commands are
applied the way the agent would (speculative attempts placed away from the avoided hosts one
Tick later, blocked hosts given no new attempts).

Reported: records/s through the three cores and events/s through the detector (time spent
inside `handle` only), the detector's cost per Tick in buckets of finished tasks (it must stay
flat as tasks finish), the speculation outcome, and peak RSS. The recorded events are then
replayed through fresh cores in a tight loop, timed as a whole (wall and CPU time, so the
figure holds on a busy machine too) and checked to give the same findings and commands.

    make bench-policy      # or: .venv/bin/python benchmarks/policy_throughput.py [--tasks N]
"""

from __future__ import annotations

import argparse
import heapq
import random
import resource
import statistics
import sys
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

from tailguard.blocklist.policy import BlocklistTracker
from tailguard.detector.policy import SlowTaskDetector
from tailguard.model.config import Settings
from tailguard.model.ids import event_id
from tailguard.model.percentile import percentile
from tailguard.model.records import (
    SPLITS_INPUT,
    AttemptCanceled,
    AttemptDeploying,
    AttemptFinished,
    BlockNodes,
    CancelReason,
    Distribution,
    EdgeSpec,
    Event,
    InputRange,
    JobFinished,
    JobGraphSpec,
    JobStatus,
    JobSubmitted,
    LaunchSpeculativeAttempts,
    NodeAdded,
    Record,
    SlowTasksDetected,
    SpeculativeAttemptWon,
    SubtaskInputs,
    Tick,
    UnblockNodes,
    VertexInitialized,
    VertexKind,
    VertexSpec,
)
from tailguard.speculator.policy import SpeculationStrategy

MIB = 1 << 20
JOB = "bench"
SLOW_FACTOR = 4.0
BYTES_PER_SECOND = 1 * MIB  # a normal host's processing rate in this synthetic job


@dataclass(frozen=True)
class Shape:
    tasks: int
    hosts: int
    slow_hosts: int
    slots: int
    seed: int

    def vertex_sizes(self) -> list[tuple[str, int]]:
        """source and map 40% each, aggregate 19%, sink 1% of the tasks."""
        sink = max(1, self.tasks // 100)
        agg = max(1, self.tasks * 19 // 100)
        src = max(1, (self.tasks - sink - agg) // 2)
        return [("src", src), ("map", self.tasks - sink - agg - src), ("agg", agg), ("sink", sink)]


def contiguous_ranges(producers: int, consumers: int) -> list[tuple[int, int]]:
    """Consumer j reads producers [start, end], balanced by count (POINTWISE)."""
    bounds = [producers * j // consumers for j in range(consumers + 1)]
    return [(bounds[j], max(bounds[j], bounds[j + 1] - 1)) for j in range(consumers)]


class Timed:
    """Total seconds spent inside one core's `handle`, and how many records it handled."""

    def __init__(self, core: Callable[[Record], list[Record]]) -> None:
        self.core = core
        self.seconds = 0.0
        self.records = 0

    def __call__(self, record: Record) -> tuple[list[Record], float]:
        start = time.perf_counter()
        out = self.core(record)
        elapsed = time.perf_counter() - start
        self.seconds += elapsed
        self.records += 1
        return out, elapsed


class SyntheticJob:
    def __init__(self, shape: Shape, settings: Settings, progress: bool) -> None:
        self.shape = shape
        self.rng = random.Random(shape.seed)
        self.progress = progress
        self.detector_core = SlowTaskDetector(settings)
        self.detector = Timed(self.detector_core.handle)
        self.speculator_core = SpeculationStrategy(settings)
        self.blocklist_core = BlocklistTracker(settings)
        self.speculator = Timed(self.speculator_core.handle)
        self.blocklist = Timed(self.blocklist_core.handle)
        self.sequence = 0
        self.now = 0
        self.hosts = [f"host-{i:04d}" for i in range(shape.hosts)]
        slow = self.rng.sample(range(shape.hosts), shape.slow_hosts)
        self.slow_hosts = {self.hosts[i] for i in slow}
        self.free: deque[str] = deque(h for _ in range(shape.slots) for h in self.hosts)
        self.blocked_until: dict[str, int] = {}
        self.sizes = shape.vertex_sizes()
        self.input_bytes: dict[str, list[int]] = {}
        # (vertex, subtask) -> attempt -> host, for live attempts
        self.live: dict[tuple[str, int], dict[int, str]] = {}
        self.next_attempt: Counter[tuple[str, int]] = Counter()
        self.done: set[tuple[str, int]] = set()
        self.running: list[tuple[int, int, str, int, int, str]] = []  # end, seq, v, s, a, host
        self.pending: deque[tuple[str, int]] = deque()
        self.launches: deque[tuple[int, LaunchSpeculativeAttempts]] = deque()
        self.finished_tasks = 0
        self.events = 0
        self.recorded: list[Event] = []
        self.outputs: list[Record] = []
        self.findings: Counter[str] = Counter()
        self.commands: Counter[str] = Counter()
        # (finished tasks, seconds, live attempts the Tick walked)
        self.tick_costs: list[tuple[int, float, int]] = []
        self.blocked_ever: set[str] = set()

    # ------------------------------------------------------------------ plumbing

    def ids(self) -> dict[str, object]:
        self.sequence += 1
        return {"job_id": JOB, "ts": self.now, "id": event_id(JOB, self.sequence)}

    def emit(self, event: Event) -> None:
        self.events += 1
        self.recorded.append(event)
        walked = self.detector_core.metrics()["attempts_examined"] if isinstance(event, Tick) else 0
        findings, elapsed = self.detector(event)
        if isinstance(event, Tick):
            walked = self.detector_core.metrics()["attempts_examined"] - walked
            self.tick_costs.append((self.finished_tasks, elapsed, int(walked)))
        for finding in findings:
            self.findings[type(finding).__name__] += 1
            self.outputs.append(finding)
            commands = self.speculator(finding)[0] + self.blocklist(finding)[0]
            self.outputs.extend(commands)
            for command in commands:
                self.commands[type(command).__name__] += 1
                self.apply(command)

    def apply(self, command: Record) -> None:
        if isinstance(command, LaunchSpeculativeAttempts):
            self.launches.append((self.now, command))
        elif isinstance(command, BlockNodes):
            for host in command.hosts:
                self.blocked_until[host] = command.until_ts
            self.blocked_ever.update(command.hosts)
        elif isinstance(command, UnblockNodes):
            for host in command.hosts:
                self.blocked_until.pop(host, None)

    # ------------------------------------------------------------------ the job

    def submit(self) -> None:
        split_bytes = tuple(self.rng.randint(8, 64) * MIB for _ in range(self.sizes[0][1]))
        self.input_bytes["src"] = list(split_bytes)
        specs = [VertexSpec("src", VertexKind.SOURCE, split_bytes=split_bytes)]
        specs += [VertexSpec(name, VertexKind.OPERATOR) for name, _ in self.sizes[1:-1]]
        specs.append(VertexSpec("sink", VertexKind.SINK))
        edges = tuple(
            EdgeSpec(a, b, Distribution.POINTWISE)
            for (a, _), (b, _) in zip(self.sizes, self.sizes[1:], strict=False)
        )
        self.emit(JobSubmitted(**self.ids(), name=JOB, graph=JobGraphSpec(tuple(specs), edges)))  # type: ignore[arg-type]
        for host in self.hosts:
            self.emit(NodeAdded(**self.ids(), host=host, slots=self.shape.slots))  # type: ignore[arg-type]
        self.initialise(0)

    def initialise(self, index: int) -> None:
        name, parallelism = self.sizes[index]
        if index == 0:
            inputs = tuple(
                SubtaskInputs(s, (InputRange(SPLITS_INPUT, s, s, 0, 0),))
                for s in range(parallelism)
            )
        else:
            producer, producers = self.sizes[index - 1]
            ranges = contiguous_ranges(producers, parallelism)
            produced = self.input_bytes[producer]
            # Producers wrote half their input (one subpartition each).
            self.input_bytes[name] = [
                sum(produced[p] // 2 for p in range(lo, hi + 1)) for lo, hi in ranges
            ]
            inputs = tuple(
                SubtaskInputs(s, (InputRange(producer, lo, hi, 0, 0),))
                for s, (lo, hi) in enumerate(ranges)
            )
        self.emit(
            VertexInitialized(
                **self.ids(),  # type: ignore[arg-type]
                vertex=name,
                parallelism=parallelism,
                subtask_inputs=inputs,
                decided_by="fixed",
            )
        )
        self.pending.extend((name, s) for s in range(parallelism))

    def take_slot(self, avoid: tuple[str, ...] = ()) -> str | None:
        """A free slot on a host that is neither blocked nor avoided (deterministic order)."""
        skipped: list[str] = []
        host = None
        while self.free:
            candidate = self.free.popleft()
            if self.blocked_until.get(candidate, 0) > self.now or candidate in avoid:
                skipped.append(candidate)
                if len(skipped) > 64:  # enough looking; a blocked or avoided host is rare
                    break
                continue
            host = candidate
            break
        self.free.extend(skipped)
        return host

    def deploy(self, task: tuple[str, int], host: str, speculative: bool) -> None:
        attempt = self.next_attempt[task]
        self.next_attempt[task] += 1
        self.live.setdefault(task, {})[attempt] = host
        size = self.input_bytes[task[0]][task[1]]
        factor = SLOW_FACTOR if host in self.slow_hosts else 1.0
        seconds = size / BYTES_PER_SECOND * factor * self.rng.uniform(0.9, 1.1)
        end = self.now + max(1000, int(seconds * 1000))
        heapq.heappush(self.running, (end, self.sequence, task[0], task[1], attempt, host))
        self.emit(
            AttemptDeploying(
                **self.ids(),  # type: ignore[arg-type]
                vertex=task[0],
                subtask=task[1],
                attempt=attempt,
                host=host,
                speculative=speculative,
            )
        )

    def finish_due(self) -> None:
        while self.running and self.running[0][0] <= self.now:
            _, _, vertex, subtask, attempt, host = heapq.heappop(self.running)
            task = (vertex, subtask)
            attempts = self.live.get(task)
            if attempts is None or attempt not in attempts:
                continue  # cancelled earlier
            del attempts[attempt]
            self.free.append(host)
            size = self.input_bytes[vertex][subtask]
            self.emit(
                AttemptFinished(
                    **self.ids(),  # type: ignore[arg-type]
                    vertex=vertex,
                    subtask=subtask,
                    attempt=attempt,
                    host=host,
                    input_bytes=size,
                    records=size // 100,
                    bytes_per_subpartition=(size // 2,),
                    checksums=(),
                )
            )
            for other, other_host in sorted(attempts.items()):
                self.free.append(other_host)
                self.emit(
                    AttemptCanceled(
                        **self.ids(),  # type: ignore[arg-type]
                        vertex=vertex,
                        subtask=subtask,
                        attempt=other,
                        host=other_host,
                        reason=CancelReason.LOST_RACE,
                    )
                )
            del self.live[task]
            self.done.add(task)
            self.finished_tasks += 1

    def run(self) -> None:
        self.submit()
        stage = 0
        started = time.perf_counter()
        last_report = started
        while self.finished_tasks < self.shape.tasks:
            self.now += 1000
            self.finish_due()
            finished_stage = sum(n for _, n in self.sizes[: stage + 1])
            if self.finished_tasks == finished_stage and stage + 1 < len(self.sizes):
                stage += 1  # BLOCKING edges: the next vertex starts once this one is done
                self.initialise(stage)
            while self.launches and self.launches[0][0] < self.now:
                self.launch(self.launches.popleft()[1])
            while self.pending:
                host = self.take_slot()
                if host is None:
                    break
                self.deploy(self.pending.popleft(), host, False)
            self.emit(Tick(**self.ids()))  # type: ignore[arg-type]
            if self.progress and time.perf_counter() - last_report >= 2:
                last_report = time.perf_counter()
                print(
                    f"  … simulated {self.now // 1000:>6} s, {self.finished_tasks:>7,} tasks"
                    f" finished, {self.events:>9,} events, {last_report - started:5.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
        self.emit(JobFinished(**self.ids(), status=JobStatus.SUCCEEDED))  # type: ignore[arg-type]

    def launch(self, command: LaunchSpeculativeAttempts) -> None:
        task = (command.vertex, command.subtask)
        if task in self.done or task not in self.live:
            return
        for _ in range(command.count):
            host = self.take_slot(command.avoid_hosts)
            if host is None:
                return
            self.deploy(task, host, True)


@dataclass(frozen=True)
class Replay:
    records: int
    wall_seconds: float
    cpu_seconds: float
    same_outputs: bool


def replay(events: list[Event], expected: list[Record], settings: Settings) -> Replay:
    """The recorded events through fresh cores, in one timed loop."""
    detector = SlowTaskDetector(settings)
    speculator = SpeculationStrategy(settings)
    blocklist = BlocklistTracker(settings)
    outputs: list[Record] = []
    wall, cpu = time.perf_counter(), time.process_time()
    for event in events:
        for finding in detector.handle(event):
            outputs.append(finding)
            outputs.extend(speculator.handle(finding))
            outputs.extend(blocklist.handle(finding))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    # Records handled, counted as in the closed loop: every event once, every finding twice.
    findings = sum(1 for r in outputs if isinstance(r, SlowTasksDetected | SpeculativeAttemptWon))
    return Replay(len(events) + 2 * findings, wall, cpu, outputs == expected)


def tick_cost_table(costs: list[tuple[int, float, int]], tasks: int, buckets: int) -> list[str]:
    width = max(1, tasks // buckets)
    grouped: dict[int, list[tuple[float, int]]] = {}
    for finished, seconds, walked in costs:
        grouped.setdefault(min(finished // width, buckets - 1), []).append((seconds * 1e6, walked))
    lines = [
        f"  {'finished tasks':>19} {'ticks':>6} {'mean µs':>9} {'p50 µs':>8} {'p99 µs':>8}"
        f" {'walked/tick':>12}"
    ]
    for bucket in sorted(grouped):
        values = sorted(micros for micros, _ in grouped[bucket])
        p99 = percentile(values, 99)
        walked = statistics.fmean(w for _, w in grouped[bucket])
        lo, hi = bucket * width, min(tasks, (bucket + 1) * width)
        lines.append(
            f"  {lo:>8,}-{hi:<10,} {len(values):>6} {statistics.fmean(values):>9.1f}"
            f" {statistics.median(values):>8.1f} {p99:>8.1f} {walked:>12.1f}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--hosts", type=int, default=1_000)
    parser.add_argument("--slow-hosts", type=int, default=10)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--buckets", type=int, default=10)
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)
    shape = Shape(args.tasks, args.hosts, args.slow_hosts, args.slots, args.seed)
    command = (
        f"{sys.executable} benchmarks/policy_throughput.py --tasks {shape.tasks}"
        f" --hosts {shape.hosts} --slow-hosts {shape.slow_hosts} --slots {shape.slots}"
        f" --seed {shape.seed}"
    )
    print(
        f"policy throughput: {shape.tasks:,} tasks, {shape.hosts:,} hosts x {shape.slots}"
        f" slots, {shape.slow_hosts} hosts {SLOW_FACTOR:g}x slower; vertices "
        + ", ".join(f"{n}={p:,}" for n, p in shape.vertex_sizes())
    )
    print(f"reproduce: {command}", flush=True)

    job = SyntheticJob(shape, Settings(), progress=not args.quiet)
    wall = time.perf_counter()
    job.run()
    wall = time.perf_counter() - wall

    cores = (job.detector, job.speculator, job.blocklist)
    core_seconds = sum(c.seconds for c in cores)
    core_records = sum(c.records for c in cores)
    speculator = job.speculator_core.metrics()
    blocklist = job.blocklist_core.metrics()
    print()
    print(f"simulated time        {job.now / 1000:,.0f} s, {len(job.tick_costs):,} Ticks")
    print(
        f"records through cores {core_records:,} in {core_seconds:.2f} s"
        f" = {core_records / core_seconds:,.0f} records/s (one core)"
    )
    print(
        f"events through detector {job.detector.records:,} in {job.detector.seconds:.2f} s"
        f" = {job.detector.records / job.detector.seconds:,.0f} events/s"
    )
    print(f"findings {dict(job.findings)}; commands {dict(job.commands)}")
    print(
        f"speculator: numSlowExecutionVertices={speculator['numSlowExecutionVertices']:.0f}"
        f" numEffectiveSpeculativeExecutions="
        f"{speculator['numEffectiveSpeculativeExecutions']:.0f}"
        f" attempts launched={speculator['speculativeAttemptsLaunched']:.0f}"
    )
    print(
        f"blocklist: blocks started={blocklist['hostsBlocked']:.0f},"
        f" BlockNodes={blocklist['blocksIssued']:.0f},"
        f" skipped by fraction={blocklist['hostsSkippedByFraction']:.0f};"
        f" hosts ever blocked {len(job.blocked_ever)}, of them slow"
        f" {len(job.blocked_ever & job.slow_hosts)} (slow hosts: {len(job.slow_hosts)})"
    )
    print("detector cost per Tick by finished tasks (walked: live attempts the Tick looked at):")
    print("\n".join(tick_cost_table(job.tick_costs, shape.tasks, args.buckets)))
    again = replay(job.recorded, job.outputs, Settings())
    print(
        f"replay of the {len(job.recorded):,} events through fresh cores:"
        f" {again.records / again.cpu_seconds:,.0f} records/s and"
        f" {len(job.recorded) / again.cpu_seconds:,.0f} events/s of CPU time"
        f" ({len(job.recorded) / again.wall_seconds:,.0f} events/s wall);"
        f" same findings and commands: {again.same_outputs}"
    )
    peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(f"wall time (incl. simulation) {wall:.1f} s; peak RSS {peak_rss_mib:,.0f} MiB")
    print(f"reproduce: {command}")
    won = job.findings[SpeculativeAttemptWon.__name__]
    slow = job.findings[SlowTasksDetected.__name__]
    # A run in which nothing was detected measured nothing; a replay that differs is a bug.
    return 0 if slow and won and again.same_outputs else 1


if __name__ == "__main__":
    sys.exit(main())
