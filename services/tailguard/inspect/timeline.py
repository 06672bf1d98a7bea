"""The timeline of one job: lanes, attempt bars, blocks and vertex phases. Pure.

What the agent records is enough to draw Spark's event timeline and Flink's subtask view:
- one lane per slot of each host. Events name the host, not the slot (a slot runner runs one
  attempt at a time), so each attempt takes the lowest slot of its host free when it deploys;
  more attempts at once than the host announced open an extra lane rather than overlap.
- one bar per attempt from `AttemptDeploying` to its end, coloured by outcome; a speculative
  copy is marked, and the bar names the command that made the agent start it.
- the spans a host was blocked (`NodeBlocked` to `NodeUnblocked`, or to its `until_ts`, or the
  job's end) and absent (`NodeRemoved` to `NodeAdded`), drawn over all lanes of the host.
- each vertex (chain) from initialisation to its first deployment and to its last attempt end.
- a mark across the whole chart where a new driver took the job over (`JobRecovered`).
All times are milliseconds after the job's start (its `JobSubmitted`).
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, replace
from typing import Any

from tailguard.decider.policy.broadcast_join import other_side
from tailguard.inspect.describe import describe, relative
from tailguard.inspect.history import AttemptEnd, AttemptKey, History, attempt_key
from tailguard.model import records as r


class Outcome(enum.Enum):
    WON = "won"  # finished first: its output is the subtask's
    LOST_RACE = "lost the race"  # cancelled because another attempt of its subtask finished
    FAILED = "failed"
    CANCELED = "cancelled"  # for a restart or the job's cancellation
    RUNNING = "running"  # no end in the archive (the job was still running, or crashed)


@dataclass(frozen=True, slots=True)
class Cause:
    """What made the agent start an attempt."""

    kind: str  # "first deployment", "speculative launch", "restart", "recovery", "unknown"
    summary: str
    # The deciding command and what caused it, when the archive holds them.
    command_id: str | None = None
    command_type: str | None = None
    because: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Bar:
    lane: int
    vertex: str
    subtask: int
    attempt: int
    host: str
    start_ms: int
    end_ms: int
    outcome: Outcome
    speculative: bool
    cause: Cause
    deploy_id: str
    end_id: str | None
    # From the attempt's end event: what it read and wrote, or why it ended.
    input_bytes: int | None = None
    records: int | None = None
    output_bytes: int | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Span:
    start_ms: int
    end_ms: int
    label: str
    record_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Mark:
    """An instant of the whole job, drawn across every lane (a driver's takeover)."""

    at_ms: int
    label: str
    record_id: str


@dataclass(frozen=True, slots=True)
class Lane:
    host: str
    slot: int


@dataclass(frozen=True, slots=True)
class HostRow:
    name: str
    lanes: tuple[int, ...]  # indices into Timeline.lanes
    blocked: tuple[Span, ...] = ()
    absent: tuple[Span, ...] = ()


@dataclass(frozen=True, slots=True)
class VertexPhase:
    """A vertex from its initialisation on: when attempts of it ran (a restart after it had
    finished opens a new running span) and whether every subtask has a winner at the end."""

    vertex: str
    operators: tuple[str, ...]
    parallelism: int | None
    decided_by: str
    initialized_ms: int | None
    running: tuple[Span, ...]
    done: bool
    attempts: int


@dataclass(frozen=True)
class Timeline:
    job_id: str
    name: str
    start_ts: int
    end_ms: int
    status: str  # the JobFinished status, or "RUNNING" when the archive has none
    lanes: tuple[Lane, ...]
    hosts: tuple[HostRow, ...]
    bars: tuple[Bar, ...]
    vertices: tuple[VertexPhase, ...]
    marks: tuple[Mark, ...] = ()


def build_timeline(history: History) -> Timeline:
    start = history.start_ts
    slots, order = _host_slots(history)
    placed = _place(history, slots, order)
    lanes: list[Lane] = []
    rows: list[HostRow] = []
    blocked = _blocked_spans(history)
    absent = _absent_spans(history)
    lane_of: dict[tuple[str, int], int] = {}
    for host in order:
        used = max((slot for (h, slot) in placed.values() if h == host), default=-1) + 1
        indices = []
        for slot in range(max(slots.get(host, 0), used, 1)):
            lane_of[(host, slot)] = len(lanes)
            indices.append(len(lanes))
            lanes.append(Lane(host, slot))
        rows.append(HostRow(host, tuple(indices), blocked.get(host, ()), absent.get(host, ())))
    bars = tuple(
        _bar(history, deploying, lane_of[placed[key]])
        for key, deploying in history.deploying.items()
    )
    return Timeline(
        job_id=history.job_id,
        name=history.submitted.name if history.submitted else history.job_id,
        start_ts=start,
        end_ms=history.end_ts - start,
        status=history.finished.status.value if history.finished else "RUNNING",
        lanes=tuple(lanes),
        hosts=tuple(rows),
        bars=tuple(sorted(bars, key=lambda b: (b.start_ms, b.lane))),
        vertices=_phases(history, bars),
        marks=tuple(
            Mark(e.ts - start, describe(e, start), e.id)
            for e in history.records
            if isinstance(e, r.JobRecovered)
        ),
    )


def _host_slots(history: History) -> tuple[dict[str, int], list[str]]:
    """Slots each host announced, and the hosts in the order they appeared."""
    slots: dict[str, int] = {}
    order: dict[str, None] = {}
    for record in history.records:
        if isinstance(record, r.NodeAdded):
            slots[record.host] = max(slots.get(record.host, 0), record.slots)
            order.setdefault(record.host)
        elif isinstance(record, r.AttemptDeploying):
            order.setdefault(record.host)
    return slots, list(order)


def _place(
    history: History, slots: dict[str, int], hosts: list[str]
) -> dict[AttemptKey, tuple[str, int]]:
    """(host, slot) of each attempt: the lowest slot of its host free when it deployed."""
    busy: dict[str, list[AttemptKey | None]] = {h: [None] * slots.get(h, 0) for h in hosts}
    placed: dict[AttemptKey, tuple[str, int]] = {}
    for record in history.records:
        if isinstance(record, r.AttemptDeploying):
            taken = busy[record.host]
            slot = next((i for i, k in enumerate(taken) if k is None), len(taken))
            if slot == len(taken):
                taken.append(None)
            taken[slot] = attempt_key(record)
            placed[attempt_key(record)] = (record.host, slot)
        elif isinstance(record, r.AttemptFinished | r.AttemptFailed | r.AttemptCanceled):
            key = attempt_key(record)
            if key in placed:
                host, slot = placed[key]
                if busy[host][slot] == key:
                    busy[host][slot] = None
    return placed


def _cause(history: History, deploying: r.AttemptDeploying) -> Cause:
    start = history.start_ts
    cause_id = history.deploy_cause.get(attempt_key(deploying))
    cause = history.record(cause_id) if cause_id else None
    if deploying.speculative:
        kind = "speculative launch"
    elif isinstance(cause, r.RestartTasks):
        kind = "restart"
    elif isinstance(cause, r.JobRecovered):
        kind = "recovery"
    elif isinstance(cause, r.VertexInitialized):
        kind = "first deployment"
    else:
        kind = "unknown"
    if cause is None:
        missing = f" (command {cause_id} is not in the archive)" if cause_id else ""
        return Cause(kind, f"no recorded cause{missing}", command_id=cause_id)
    summary = f"{type(cause).__name__}: {describe(cause, start)}"
    if isinstance(cause, r.VertexInitialized) and cause.command_id:
        # A first attempt: the command is the one that initialised its vertex.
        command = history.record(cause.command_id)
        if command is None:
            return Cause(kind, summary, cause.command_id)
        cause = command
        summary = f"{summary} ← {type(cause).__name__}: {describe(cause, start)}"
    if not isinstance(cause, r.Command):
        return Cause(kind, summary)
    because = tuple(
        f"{type(c).__name__} {c.id} at {relative(c.ts, start)}: {describe(c, start)}"
        if (c := history.record(ref)) is not None
        else f"{ref} (not in the archive)"
        for ref in cause.caused_by
    )
    return Cause(kind, summary, cause.id, type(cause).__name__, because)


def _bar(history: History, deploying: r.AttemptDeploying, lane: int) -> Bar:
    start = history.start_ts
    end: AttemptEnd | None = history.ended.get(attempt_key(deploying))
    outcome, detail = Outcome.RUNNING, ""
    if isinstance(end, r.AttemptFinished):
        outcome = Outcome.WON
    elif isinstance(end, r.AttemptFailed):
        outcome, detail = Outcome.FAILED, describe(end, start)
    elif isinstance(end, r.AttemptCanceled):
        lost = end.reason is r.CancelReason.LOST_RACE
        outcome = Outcome.LOST_RACE if lost else Outcome.CANCELED
        detail = f"cancelled: {end.reason.value}"
    finished = end if isinstance(end, r.AttemptFinished) else None
    return Bar(
        lane=lane,
        vertex=deploying.vertex,
        subtask=deploying.subtask,
        attempt=deploying.attempt,
        host=deploying.host,
        start_ms=deploying.ts - start,
        # An attempt without an end in the archive runs to the archive's end.
        end_ms=(max(end.ts, deploying.ts) if end else history.end_ts) - start,
        outcome=outcome,
        speculative=deploying.speculative,
        cause=_cause(history, deploying),
        deploy_id=deploying.id,
        end_id=end.id if end else None,
        input_bytes=finished.input_bytes if finished else None,
        records=finished.records if finished else None,
        output_bytes=sum(finished.bytes_per_subpartition) if finished else None,
        detail=detail,
    )


def _blocked_spans(history: History) -> dict[str, tuple[Span, ...]]:
    """Per host, the spans it was blocked. A new block of a blocked host extends it (one span);
    a block the agent lifted without an event ends at its `until_ts`."""
    start, end = history.start_ts, history.end_ts
    spans: dict[str, list[Span]] = {}
    open_blocks: dict[str, tuple[int, int, list[str]]] = {}  # host -> (from, until, ids)

    def close(host: str, at: int, extra: tuple[str, ...] = ()) -> None:
        since, until, ids = open_blocks.pop(host)
        label = f"blocked {relative(since, start)} to {relative(min(at, until), start)}"
        spans.setdefault(host, []).append(
            Span(since - start, min(at, until) - start, label, (*ids, *extra))
        )

    for record in history.records:
        if isinstance(record, r.NodeBlocked):
            held = open_blocks.get(record.host)
            if held is not None and record.ts > held[1]:
                close(record.host, held[1])  # expired before this new block
                held = None
            ids = [*(held[2] if held else []), record.id, *filter(None, [record.command_id])]
            since = held[0] if held else record.ts
            open_blocks[record.host] = (since, max(record.until_ts, held[1] if held else 0), ids)
        elif isinstance(record, r.NodeUnblocked) and record.host in open_blocks:
            close(record.host, record.ts, (record.id,))
    for host in list(open_blocks):
        close(host, end)
    return {host: tuple(s) for host, s in spans.items()}


def _absent_spans(history: History) -> dict[str, tuple[Span, ...]]:
    """Per host, the spans it was gone: NodeRemoved until it was added again."""
    start = history.start_ts
    spans: dict[str, list[Span]] = {}
    gone: dict[str, r.NodeRemoved] = {}
    for record in history.records:
        if isinstance(record, r.NodeRemoved):
            gone.setdefault(record.host, record)
        elif isinstance(record, r.NodeAdded) and record.host in gone:
            removed = gone.pop(record.host)
            spans.setdefault(record.host, []).append(
                Span(
                    removed.ts - start,
                    record.ts - start,
                    f"removed: {removed.reason}",
                    (removed.id, record.id),
                )
            )
    for host, removed in gone.items():
        spans.setdefault(host, []).append(
            Span(
                removed.ts - start,
                history.end_ts - start,
                f"removed: {removed.reason}",
                (removed.id,),
            )
        )
    return {host: tuple(s) for host, s in spans.items()}


def _phases(history: History, bars: tuple[Bar, ...]) -> tuple[VertexPhase, ...]:
    start = history.start_ts
    graph = history.submitted.graph.vertices if history.submitted else ()
    names = [v.name for v in graph]
    operators = {v.name: v.operators for v in graph}
    initialized: dict[str, r.VertexInitialized] = {}
    for record in history.records:
        if isinstance(record, r.VertexInitialized):
            initialized.setdefault(record.vertex, record)
            if record.vertex not in operators:
                names.append(record.vertex)
    for bar in bars:
        if bar.vertex not in names:
            names.append(bar.vertex)
    inside = _fused(history, bars)
    phases = []
    for name in names:
        mine = [b for b in bars if b.vertex == name]
        init = initialized.get(name)
        won = {b.subtask for b in mine if b.outcome is Outcome.WON}
        phases.append(
            VertexPhase(
                vertex=name,
                operators=operators.get(name, ()),
                parallelism=init.parallelism if init else None,
                decided_by=init.decided_by if init else "not initialised",
                initialized_ms=init.ts - start if init else None,
                running=_running_spans(mine),
                done=init is not None and won >= set(range(init.parallelism)),
                attempts=len(mine),
            )
        )
    done = {p.vertex: p.done for p in phases}
    return tuple(
        replace(
            p,
            decided_by=f"{p.decided_by}; ran inside {inside[p.vertex]}",
            done=done[inside[p.vertex]],
        )
        if p.vertex in inside
        else p
        for p in phases
    )


def _fused(history: History, bars: tuple[Bar, ...]) -> dict[str, str]:
    """The other sides of broadcast joins that ran inside their join's subtasks, so are done
    when the join is: the archive records the decision, and the agent's rule (`other_side`)
    says what it made of the other side. A vertex with an attempt of its own was not fused,
    and one with none had not started when the decision came."""
    ran = {b.vertex for b in bars}
    edges = history.submitted.graph.edges if history.submitted else ()
    inside: dict[str, str] = {}
    for record in history.records:
        if not isinstance(record, r.SetParallelism) or record.broadcast is None:
            continue
        for e in edges:
            if e.target != record.vertex or e.source == record.broadcast.input:
                continue
            layout = other_side(
                started=e.source in ran,
                consumers=sum(1 for x in edges if x.source == e.source),
                reads=any(x.target == e.source for x in edges),
            )
            if layout == "fused":
                inside.setdefault(e.source, record.vertex)
    return inside


def _running_spans(bars: list[Bar]) -> tuple[Span, ...]:
    """The union of the bars' intervals: when at least one attempt of the vertex ran."""
    merged: list[list[int]] = []
    for bar in sorted(bars, key=lambda b: b.start_ms):
        if merged and bar.start_ms <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], bar.end_ms)
        else:
            merged.append([bar.start_ms, bar.end_ms])
    return tuple(Span(a, b, f"running +{a / 1000:.3f} s to +{b / 1000:.3f} s") for a, b in merged)


def as_data(timeline: Timeline) -> dict[str, Any]:
    """The timeline as JSON-ready data (enums as their values), what the page draws from."""
    return asdict(timeline, dict_factory=_json_dict)


def _json_dict(items: list[tuple[str, Any]]) -> dict[str, Any]:
    return {k: v.value if isinstance(v, enum.Enum) else v for k, v in items}
