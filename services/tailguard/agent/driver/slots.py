"""The slot pool and placement: one slot per executor core, blocked hosts skipped.

Requests are served oldest first (FLIP-119's FIFO assignment); a request for a pipelined region
is a bulk that is served only when every one of its tasks can get a slot at once, so regions
never hold part of the cluster while waiting for the rest (no allocation deadlock).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class Host:
    name: str
    slots: int
    used: int = 0
    blocked_until: int | None = None

    @property
    def free(self) -> int:
        return max(0, self.slots - self.used)


@dataclass
class SlotRequest:
    """A bulk of tasks that must start together; `avoid` lists hosts each must not use."""

    key: object
    tasks: list[object]
    avoid: dict[object, frozenset[str]] = field(default_factory=dict)
    not_before: int = 0


class SlotPool:
    def __init__(self) -> None:
        self.hosts: dict[str, Host] = {}
        self._queue: list[SlotRequest] = []

    # ------------------------------------------------------------- cluster changes

    def add_host(self, name: str, slots: int) -> bool:
        """True if the host is new."""
        host = self.hosts.get(name)
        if host is None:
            self.hosts[name] = Host(name, slots)
            return True
        host.slots = slots
        return False

    def remove_host(self, name: str) -> None:
        self.hosts.pop(name, None)

    def block(self, name: str, until: int) -> None:
        if name in self.hosts:
            self.hosts[name].blocked_until = until

    def unblock(self, name: str) -> None:
        if name in self.hosts:
            self.hosts[name].blocked_until = None

    def expired_blocks(self, now: int) -> list[str]:
        return sorted(
            h.name
            for h in self.hosts.values()
            if h.blocked_until is not None and h.blocked_until <= now
        )

    def blocked(self) -> list[str]:
        return sorted(h.name for h in self.hosts.values() if h.blocked_until is not None)

    def total_slots(self) -> int:
        return sum(h.slots for h in self.hosts.values())

    # ------------------------------------------------------------- requests

    def request(self, request: SlotRequest) -> None:
        self._queue.append(request)

    def cancel(self, key: object) -> None:
        self._queue = [r for r in self._queue if r.key != key]

    def cancel_task(self, task: object, kind: str) -> None:
        """Drop queued requests of `kind` (the first element of their key) for `task`."""
        self._queue = [
            r
            for r in self._queue
            if not (isinstance(r.key, tuple) and r.key[0] == kind and task in r.tasks)
        ]

    def pending(self) -> list[SlotRequest]:
        return list(self._queue)

    def release(self, host: str) -> None:
        if host in self.hosts:
            self.hosts[host].used = max(0, self.hosts[host].used - 1)

    def _place(self, request: SlotRequest, usage: dict[str, int]) -> dict[object, str] | None:
        placed: dict[object, str] = {}
        for task in request.tasks:
            avoid = request.avoid.get(task, frozenset())
            candidates = [
                h
                for h in self.hosts.values()
                if h.blocked_until is None
                and h.name not in avoid
                and h.slots - usage.get(h.name, h.used) > 0
            ]
            if not candidates:
                return None
            # Most free slots first spreads the load; the name makes the choice deterministic.
            best = min(candidates, key=lambda h: (-(h.slots - usage.get(h.name, h.used)), h.name))
            usage[best.name] = usage.get(best.name, best.used) + 1
            placed[task] = best.name
        return placed

    def assign(self, now: int) -> list[tuple[SlotRequest, dict[object, str]]]:
        """Serve the queue oldest first; returns the requests that got all their slots."""
        served: list[tuple[SlotRequest, dict[object, str]]] = []
        remaining: list[SlotRequest] = []
        for request in self._queue:
            if request.not_before > now:
                remaining.append(request)
                continue
            usage: dict[str, int] = {}
            placed = self._place(request, usage)
            if placed is None:
                remaining.append(request)
                continue
            for host in placed.values():
                self.hosts[host].used += 1
            served.append((request, placed))
        self._queue = remaining
        return served

    def could_ever_place(self, request: SlotRequest) -> bool:
        """Whether the request fits the cluster when idle and unblocked (else it never will)."""
        saved = {h.name: (h.used, h.blocked_until) for h in self.hosts.values()}
        try:
            for h in self.hosts.values():
                h.used, h.blocked_until = 0, None
            return self._place(request, {}) is not None
        finally:
            for name, (used, until) in saved.items():
                self.hosts[name].used, self.hosts[name].blocked_until = used, until

    def hosts_named(self, names: Iterable[str]) -> list[str]:
        return [n for n in names if n in self.hosts]
