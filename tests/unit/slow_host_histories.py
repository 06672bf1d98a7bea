"""A single-vertex job with progress reports, for the slow-host rule's tests.

Each host has `slots` slots; tasks take free slots in index order (a blocked host takes none) and
read their input at a constant rate per byte: the task's own time per byte × its host's factor
(for host 0 turning slow, the late factor from then on, also in the middle of an attempt).
Every interval each running attempt reports its bytes read, then a Tick follows; finishes in
between are events at their exact time. The detector's findings go to the speculator and the
blocklist; blocks are applied (no new task on a blocked host), copies are not (the tests look at
what is decided, and when).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from speculation_histories import JobEvents, one_split_each, source

from tailguard.blocklist.policy import BlocklistTracker
from tailguard.detector.policy import SlowTaskDetector
from tailguard.model.config import Settings
from tailguard.model.records import BlockNodes, Event, Record, SlowTasksDetected
from tailguard.speculator.policy import SpeculationStrategy

MB = 1_000_000
INTERVAL_MS = 500


@dataclass(frozen=True)
class Job:
    # Time factor per host (1: healthy, 5: five times slower per byte); host i is "h<i>".
    host_factor: tuple[float, ...]
    # Input bytes per task.
    task_bytes: tuple[int, ...]
    # The task's own time per byte factor (noise, or a task slow by its own data).
    task_factor: tuple[float, ...]
    # ms per MB on a healthy host for a task of factor 1.
    ms_per_mb: float = 200.0
    # From this ts on, host 0's factor is `late_factor` (a node that turns slow mid-job), for
    # the attempts running there then as well as for later ones.
    turns_slow_at: int | None = None
    late_factor: float = 1.0
    slots: int = 1
    # Each attempt reads its whole input at once (one batch), then processes it: its reports
    # say "all read" from the first one (the bench's I/O job: one split, one batch).
    front_loaded: bool = False
    # Reads arrive in batches of this many bytes (a report counts whole batches only, so it lags
    # the work by up to one batch); None: every byte as it is read.
    batch_bytes: int | None = None
    # When each host joins (its NodeAdded, and its slots free from then); None: all at 0.
    joins_at: tuple[int, ...] | None = None
    # A slot's first attempt reads nothing for this long (its worker starts: a Python process,
    # libraries, a JIT), then at its rate; later attempts on the slot start at once.
    cold_start_ms: int = 0
    # Spark's view (attach mode): no attempt's input size is known before it finishes (no
    # assigned splits, reports without a total), and a running attempt reports only with its
    # executor's heartbeat, every `report_every` Ticks.
    sizes_known: bool = True
    report_every: int = 1
    # The share of an attempt's time spent reading: it reads its input at 1/read_share its
    # pace, then processes what it read for the rest of its time, reading nothing (a task that
    # aggregates or writes after its scan). 1: it reads until it ends. Not with `turns_slow_at`.
    read_share: float = 1.0


@dataclass(frozen=True)
class _Attempt:
    task: int
    start: int  # when it reads its first byte (deploying, plus a cold start)
    per_byte: float  # ms per byte from the start...
    switch: int | None = None  # ...until this ts (host 0 turning slow), then:
    late_per_byte: float = 0.0
    read_share: float = 1.0  # `Job.read_share`: reads at 1/read_share the pace, then processes

    def read_at(self, ts: int) -> float:
        if ts <= self.start:
            return 0.0
        if self.switch is None or ts <= self.switch:
            return (ts - self.start) / (self.per_byte * self.read_share)
        return (self.switch - self.start) / self.per_byte + (ts - self.switch) / self.late_per_byte

    def end(self, total: int) -> int:
        if self.switch is None or total <= self.read_at(self.switch):
            return self.start + round(total * self.per_byte)
        return self.switch + round((total - self.read_at(self.switch)) * self.late_per_byte)


@dataclass
class Run:
    events: list[Event] = field(default_factory=list)
    findings: list[SlowTasksDetected] = field(default_factory=list)
    commands: list[Record] = field(default_factory=list)
    # ts of each host's first progress report.
    first_report: dict[str, int] = field(default_factory=dict)

    def found(self, host: str) -> list[int]:
        """When findings named `host` slow."""
        return [f.ts for f in self.findings if host in f.slow_hosts]

    def blocked(self) -> set[str]:
        return {h for c in self.commands if isinstance(c, BlockNodes) for h in c.hosts}


def run_job(job: Job, config: dict[str, str] | None = None, limit_ms: int = 600_000) -> Run:
    settings = Settings(config or {})
    detector = SlowTaskDetector(settings)
    speculator, blocklist = SpeculationStrategy(settings), BlocklistTracker(settings)
    ev, out = JobEvents(), Run()
    # Per slot, its host's name and index.
    hosts = [f"h{i // job.slots}" for i in range(len(job.host_factor) * job.slots)]

    def emit(event: Event) -> None:
        out.events.append(event)
        for finding in detector.handle(event):
            assert isinstance(finding, SlowTasksDetected)
            out.findings.append(finding)
            for command in speculator.handle(finding) + blocklist.handle(finding):
                out.commands.append(command)
                if isinstance(command, BlockNodes):
                    for host in command.hosts:
                        blocked_until[host] = command.until_ts

    def factor(slot: int, ts: int) -> float:
        host = slot // job.slots
        if host == 0 and job.turns_slow_at is not None and ts >= job.turns_slow_at:
            return job.late_factor
        return job.host_factor[host]

    if job.read_share != 1.0 and (job.turns_slow_at is not None or not 0 < job.read_share < 1):
        raise ValueError("read_share is a share in (0, 1], and not with turns_slow_at")
    blocked_until: dict[str, int] = {}
    n = len(job.task_bytes)
    if job.sizes_known:
        emit(ev.submitted((source("v", job.task_bytes),), config=config))
    else:
        emit(ev.submitted((source("v", ()),), config=config))
    joins = job.joins_at or (0,) * len(job.host_factor)
    waiting = sorted((at, index) for index, at in enumerate(joins))
    emit(ev.initialized("v", one_split_each(n) if job.sizes_known else (), parallelism=n))
    pending = list(range(n))
    # slot index -> its running attempt
    running: dict[int, _Attempt] = {}
    free: list[int] = []
    warm: set[int] = set()  # slots that have started their worker

    def join(now: int) -> None:
        while waiting and waiting[0][0] <= now:
            at, index = waiting.pop(0)
            emit(ev.node(f"h{index}", ts=at, slots=job.slots))
            free.extend(range(index * job.slots, (index + 1) * job.slots))

    def place(now: int) -> None:
        for host in sorted(free):
            if not pending:
                return
            if blocked_until.get(hosts[host], 0) > now:
                continue
            task = pending.pop(0)
            free.remove(host)
            per_mb = job.ms_per_mb * job.task_factor[task] / MB
            start = now if host in warm else now + job.cold_start_ms
            warm.add(host)
            attempt = _Attempt(task, start, per_mb * factor(host, now), read_share=job.read_share)
            switch = job.turns_slow_at
            if host // job.slots == 0 and switch is not None and now < switch:
                attempt = _Attempt(task, start, attempt.per_byte, switch, per_mb * job.late_factor)
            running[host] = attempt
            emit(ev.deploying("v", task, now, hosts[host]))

    join(0)
    place(0)
    now, ticks = 0, 0
    while (pending or running) and now < limit_ms:
        tick = now + INTERVAL_MS
        ends = sorted((a.end(job.task_bytes[a.task]), host) for host, a in running.items())
        for end, host in ends:
            if end > tick:
                break
            task = running.pop(host).task
            emit(ev.finished("v", task, end, hosts[host], input_bytes=job.task_bytes[task]))
            free.append(host)
            place(end)
        now, ticks = tick, ticks + 1
        join(now)
        for host, attempt in sorted(running.items()) if ticks % job.report_every == 0 else ():
            task = attempt.task
            read = min(job.task_bytes[task], int(attempt.read_at(now)))
            if job.batch_bytes is not None and read < job.task_bytes[task]:
                read -= read % job.batch_bytes
            if job.front_loaded:
                read = job.task_bytes[task]
            if read > 0:
                out.first_report.setdefault(hosts[host], now)
            total = job.task_bytes[task] if job.sizes_known else None
            emit(ev.progress("v", task, now, read, total, host=hosts[host]))
        emit(ev.tick(now))
        place(now)
    return out
