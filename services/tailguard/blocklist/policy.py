"""Slow-node blocking (FLIP-168 / FLIP-224), as a pure core: findings in, commands out.

The hosts of slow attempts are blocked (MARK_BLOCKED: no new attempts there) until the finding's
time plus `execution.batch.speculative.block-slow-node-duration`. The detector repeats a finding
every Tick while a vertex is slow; each repeat extends the blocks, but a `BlockNodes` is only
re-emitted once the extension reaches half the duration, which keeps the command topic small
while a block can never lapse under a host that stays slow.

At most floor(`blocklist.max-blocked-fraction` × registered hosts) hosts are blocked at once,
and never all of them, so a job can always make progress. When more hosts qualify, those with
the most slow attempts go first, then by name; the rest are skipped.

Blocks are tracked against the time of the findings (the agent lifts a block when its time is
up), so this core never needs the wall clock.
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict
from typing import ClassVar

from tailguard.model.config import Settings
from tailguard.model.ids import derived_id
from tailguard.model.records import BlockNodes, Record, SlowTasksDetected, UnblockNodes

__all__ = ["BlocklistTracker"]

# Findings carry no end-of-job marker, so beyond this many jobs with live blocks the least
# recently active job's state is dropped (its blocks expire at the agent anyway).
MAX_TRACKED_JOBS = 1024


class BlocklistTracker:
    SERVICE: ClassVar[str] = "blocklist"

    def __init__(self, settings: Settings, max_tracked_jobs: int = MAX_TRACKED_JOBS) -> None:
        self.settings = settings
        self._duration_ms = settings.duration_ms(
            "execution.batch.speculative.block-slow-node-duration"
        )
        self._fraction = settings.number("blocklist.max-blocked-fraction")
        self._max_jobs = max_tracked_jobs
        # job -> host -> until ts of the last BlockNodes emitted for it (what the agent holds).
        self._blocked: OrderedDict[str, dict[str, int]] = OrderedDict()
        self._blocks_issued = 0
        self._hosts_blocked = 0
        self._skipped = 0
        self._unblocks_issued = 0

    def handle(self, record: Record) -> list[Record]:
        if not isinstance(record, SlowTasksDetected):
            return []
        blocked = self._blocked.pop(record.job_id, {})
        out = self._update(record, blocked)
        if blocked:
            self._blocked[record.job_id] = blocked
            while len(self._blocked) > self._max_jobs:
                self._blocked.popitem(last=False)
        return out

    def metrics(self) -> dict[str, float]:
        return {
            "blockedHosts": float(sum(len(hosts) for hosts in self._blocked.values())),
            "blocksIssued": float(self._blocks_issued),
            "hostsBlocked": float(self._hosts_blocked),
            "hostsSkippedByFraction": float(self._skipped),
            "unblocksIssued": float(self._unblocks_issued),
        }

    def limit(self, registered_hosts: int) -> int:
        """How many hosts may be blocked at once in a cluster of this size."""
        return max(0, min(math.floor(self._fraction * registered_hosts), registered_hosts - 1))

    def _update(self, finding: SlowTasksDetected, blocked: dict[str, int]) -> list[Record]:
        now = finding.ts
        registered = set(finding.hosts)
        # A block whose time is up is lifted by the agent. A block on a host that left the
        # cluster stays (the agent still holds it should the host come back) but takes no slot
        # of the fraction while the host is away.
        for host in [h for h, until in blocked.items() if until <= now]:
            del blocked[host]
        out: list[Record] = []
        limit = self.limit(len(registered))
        in_cluster = sum(1 for h in blocked if h in registered)
        if in_cluster > limit:  # the cluster shrank, or blocked hosts came back
            out.append(self._unblock(finding, blocked, registered, in_cluster - limit))
            in_cluster = limit
        slow_attempts = Counter(
            attempt.host
            for subtask in finding.slow
            for attempt in subtask.live_attempts
            if attempt.slow and attempt.host in registered
        )
        until = now + self._duration_ms
        to_emit: list[str] = []
        for host, _ in sorted(slow_attempts.items(), key=lambda item: (-item[1], item[0])):
            current = blocked.get(host)
            if current is None and in_cluster >= limit:
                self._skipped += 1
                continue
            if current is None or until - current >= self._duration_ms / 2:
                blocked[host] = until
                to_emit.append(host)
                if current is None:
                    in_cluster += 1
                    self._hosts_blocked += 1
        if to_emit:
            hosts = tuple(sorted(to_emit))
            self._blocks_issued += 1
            out.append(
                BlockNodes(
                    job_id=finding.job_id,
                    ts=now,
                    id=derived_id(self.SERVICE, finding.id, *hosts),
                    caused_by=(finding.id,),
                    hosts=hosts,
                    until_ts=until,
                    cause=f"slow attempts of vertex {finding.vertex}",
                )
            )
        return out

    def _unblock(
        self,
        finding: SlowTasksDetected,
        blocked: dict[str, int],
        registered: set[str],
        excess: int,
    ) -> UnblockNodes:
        """Lift the blocks that would end soonest (then by name) to get back under the limit."""
        candidates = [h for h in blocked if h in registered]
        lifted = sorted(candidates, key=lambda h: (blocked[h], h))[:excess]
        for host in lifted:
            del blocked[host]
        hosts = tuple(sorted(lifted))
        self._unblocks_issued += 1
        return UnblockNodes(
            job_id=finding.job_id,
            ts=finding.ts,
            id=derived_id(self.SERVICE, finding.id, "unblock", *hosts),
            caused_by=(finding.id,),
            hosts=hosts,
        )
