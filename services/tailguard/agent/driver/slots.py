"""The slot pool and placement: one slot per connected slot runner, blocked hosts skipped.

A slot is a runner (Flink's TaskExecutor slot): it appears when its runner connects and goes
when the runner's connection or Spark task ends. Requests are served oldest first (FLIP-119's
FIFO assignment); a request for a pipelined region is a bulk that is served only when every one
of its tasks can get a slot at once, so regions never hold part of the cluster while waiting for
the rest (no allocation deadlock).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple


class ExecutionVertexId(NamedTuple):
    """One subtask of one chain (Flink's ExecutionVertexID)."""

    vertex: str
    subtask: int


@dataclass(frozen=True)
class TaskRequest:
    """A subtask that needs its (next) attempt."""

    task: ExecutionVertexId


@dataclass(frozen=True)
class SpeculativeRequest:
    """One of the copies a `LaunchSpeculativeAttempts` command asked for."""

    task: ExecutionVertexId
    command_id: str
    copy: int


@dataclass(frozen=True)
class RegionRequest:
    """A pipelined region's bulk, named by its first task."""

    head: ExecutionVertexId


RequestKey = TaskRequest | SpeculativeRequest | RegionRequest


class Slot(NamedTuple):
    host: str
    slot_id: str


@dataclass
class Host:
    name: str
    # Slot ids in the order their runners connected (placement takes the first free one).
    slots: list[str] = field(default_factory=list)
    busy: set[str] = field(default_factory=set)
    blocked_until: int | None = None

    @property
    def capacity(self) -> int:
        return len(self.slots)

    @property
    def free(self) -> int:
        return len(self.slots) - len(self.busy)


@dataclass
class SlotRequest:
    """A bulk of tasks that must start together; `avoid` lists hosts each must not use."""

    key: RequestKey
    tasks: list[ExecutionVertexId]
    avoid: dict[ExecutionVertexId, frozenset[str]] = field(default_factory=dict)
    not_before: int = 0


class SlotPool:
    def __init__(self) -> None:
        self.hosts: dict[str, Host] = {}
        self._host_of: dict[str, str] = {}
        self._queue: list[SlotRequest] = []
        # Blocks of hosts without a slot now (a fleet-listed or recovered host whose runners
        # have not connected yet, or whose runners all went): they hold when the host joins.
        self._absent_blocks: dict[str, int] = {}

    # ------------------------------------------------------------- cluster changes

    def add_slot(self, host: str, slot_id: str) -> bool:
        """A runner connected; True if its host is new to the pool."""
        entry = self.hosts.get(host)
        new = entry is None
        if entry is None:
            entry = self.hosts[host] = Host(host, blocked_until=self._absent_blocks.pop(host, None))
        if slot_id not in entry.slots:
            entry.slots.append(slot_id)
            self._host_of[slot_id] = host
        return new

    def add_host(self, host: str, slots: int) -> bool:
        """`slots` anonymous slots on `host` (tests and simulations without runners)."""
        new = host not in self.hosts
        for k in range(slots):
            self.add_slot(host, f"{host}/{k}")
        return new

    def remove_slot(self, slot_id: str) -> tuple[str | None, bool]:
        """A runner went away: (its host, whether the host has no slot left and is gone)."""
        host = self._host_of.pop(slot_id, None)
        if host is None:
            return None, False
        entry = self.hosts[host]
        entry.slots.remove(slot_id)
        entry.busy.discard(slot_id)
        if entry.slots:
            return host, False
        del self.hosts[host]
        if entry.blocked_until is not None:
            self._absent_blocks[host] = entry.blocked_until
        return host, True

    def host_of(self, slot_id: str) -> str | None:
        return self._host_of.get(slot_id)

    def block(self, name: str, until: int) -> None:
        """Block `name` until `until`; a host with no slot yet is blocked from when it joins."""
        if name in self.hosts:
            self.hosts[name].blocked_until = until
        else:
            self._absent_blocks[name] = until

    def unblock(self, name: str) -> None:
        if name in self.hosts:
            self.hosts[name].blocked_until = None
        self._absent_blocks.pop(name, None)

    def _blocks(self) -> dict[str, int]:
        """Every block in force: hosts in the pool, and hosts without a slot now."""
        held = {h.name: h.blocked_until for h in self.hosts.values() if h.blocked_until is not None}
        return {**self._absent_blocks, **held}

    def expired_blocks(self, now: int) -> list[str]:
        # An absent host's block expires too: its NodeUnblocked is due whether or not it joined.
        return sorted(name for name, until in self._blocks().items() if until <= now)

    def blocked(self) -> list[str]:
        return sorted(self._blocks())

    def total_slots(self) -> int:
        return sum(h.capacity for h in self.hosts.values())

    # ------------------------------------------------------------- requests

    def request(self, request: SlotRequest) -> None:
        self._queue.append(request)

    def cancel(self, key: RequestKey) -> None:
        self._queue = [r for r in self._queue if r.key != key]

    def cancel_speculative(self, task: ExecutionVertexId) -> None:
        """Drop the queued speculative copies of `task` (it has a winner)."""
        self._queue = [
            r
            for r in self._queue
            if not (isinstance(r.key, SpeculativeRequest) and r.key.task == task)
        ]

    def pending(self) -> list[SlotRequest]:
        return list(self._queue)

    def queued_keys(self) -> set[RequestKey]:
        return {r.key for r in self._queue}

    def release(self, slot_id: str) -> None:
        host = self._host_of.get(slot_id)
        if host is not None:
            self.hosts[host].busy.discard(slot_id)

    def _place(
        self, request: SlotRequest, usage: dict[str, int]
    ) -> dict[ExecutionVertexId, str] | None:
        placed: dict[ExecutionVertexId, str] = {}
        for task in request.tasks:
            avoid = request.avoid.get(task, frozenset())
            candidates = [
                h
                for h in self.hosts.values()
                if h.blocked_until is None
                and h.name not in avoid
                and h.capacity - usage.get(h.name, len(h.busy)) > 0
            ]
            if not candidates:
                return None
            # Most free slots first spreads the load; the name makes the choice deterministic.
            best = min(
                candidates,
                key=lambda h: (-(h.capacity - usage.get(h.name, len(h.busy))), h.name),
            )
            usage[best.name] = usage.get(best.name, len(best.busy)) + 1
            placed[task] = best.name
        return placed

    def _take(self, host: str) -> str:
        entry = self.hosts[host]
        slot_id = next(s for s in entry.slots if s not in entry.busy)
        entry.busy.add(slot_id)
        return slot_id

    def assign(
        self, now: int, still_wanted: Callable[[SlotRequest], bool] | None = None
    ) -> list[tuple[SlotRequest, dict[ExecutionVertexId, Slot]]]:
        """Serve the queue oldest first; returns the requests that got all their slots, each
        slot taken. A request `still_wanted` says is stale (the job changed while it waited) is
        dropped before it can take a slot from the requests behind it."""
        served: list[tuple[SlotRequest, dict[ExecutionVertexId, Slot]]] = []
        remaining: list[SlotRequest] = []
        free = sum(h.free for h in self.hosts.values() if h.blocked_until is None)
        for request in self._queue:
            # With every usable slot taken nothing more can be served: the rest of the queue
            # waits untouched (this runs after every message the driver handles).
            if free == 0 or request.not_before > now:
                remaining.append(request)
                continue
            if still_wanted is not None and not still_wanted(request):
                continue
            placed = self._place(request, {})
            if placed is None:
                remaining.append(request)
                continue
            served.append(
                (request, {task: Slot(host, self._take(host)) for task, host in placed.items()})
            )
            free -= len(placed)
        self._queue = remaining
        return served

    def could_ever_place(self, request: SlotRequest) -> bool:
        """Whether the request fits the cluster when idle and unblocked (else it never will)."""
        usage = {name: 0 for name in self.hosts}
        saved = {h.name: h.blocked_until for h in self.hosts.values()}
        try:
            for h in self.hosts.values():
                h.blocked_until = None
            return self._place(request, usage) is not None
        finally:
            for name, until in saved.items():
                self.hosts[name].blocked_until = until

    def hosts_named(self, names: Iterable[str]) -> list[str]:
        return [n for n in names if n in self.hosts]
