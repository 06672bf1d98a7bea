"""Applying the fleet blocklist when a job starts (`tailguard.model.fleet`).

Before its first attempt, a job reads the compacted topic `tailguard.blocklist` to its end and
blocks the hosts that are on the list, for the list's expiry: `NodeBlocked` with the fleet cause
(what the block is for and the ids of the findings behind it) and the fleet decision's id, so
the job's archive says which blocks it applied and why. The per-job cap still holds
(`blocklist.max-blocked-fraction` of this job's hosts, the rule `BlockNodes` is checked
against): hosts with the latest expiry go first, then by name. A job opts out with
`blocklist.fleet = false`.

If the list cannot be read (no broker, a timeout) the job starts without it and says so: the
list is an optimisation, never a reason not to run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Protocol

from tailguard.model.blocking import blocked_fraction_problem
from tailguard.model.config import Settings
from tailguard.model.fleet import FLEET_SETTING, FleetBlock, current_entries

if TYPE_CHECKING:  # the driver imports this module
    from tailguard.agent.driver.slots import SlotPool

log = logging.getLogger(__name__)

# What reads the list's changes (the Kafka adapter: `tailguard.blocklist.fleet_topic.read_changes`).
FleetListReader = Callable[[], list[FleetBlock]]


class StartingJob(Protocol):
    """What this module needs of the driver."""

    job_id: str
    settings: Settings

    @property
    def pool(self) -> SlotPool: ...

    @property
    def hosts(self) -> frozenset[str]:
        """The job's hosts, joined the pool or not yet (runners still connecting)."""

    @property
    def max_blocked_fraction(self) -> float: ...

    def now(self) -> int: ...

    def block_host(self, host: str, until_ts: int, cause: str, command_id: str) -> None: ...


def blocks_to_apply(
    changes: list[FleetBlock],
    hosts: Collection[str],
    blocked: Collection[str],
    fraction: float,
    now: int,
) -> list[FleetBlock]:
    """The fleet entries in force at `now` on the job's `hosts`, as many as its cap allows."""
    current = current_entries(changes, now)
    mine = sorted(
        (e for h, e in current.items() if h in hosts), key=lambda e: (-(e.until_ts or 0), e.host)
    )
    taken: list[FleetBlock] = []
    for entry in mine:
        held = {*blocked, *(e.host for e in taken)}
        if blocked_fraction_problem(held, (entry.host,), hosts, fraction) is None:
            taken.append(entry)
        else:
            log.info("fleet block on %s not applied: over the job's cap", entry.host)
    return taken


def apply_fleet_list(job: StartingJob, read: FleetListReader) -> list[FleetBlock]:
    """Block the job's hosts that are on the fleet list; returns the entries applied."""
    if not job.settings.flag(FLEET_SETTING):
        log.info("job %s opted out of the fleet blocklist (%s)", job.job_id, FLEET_SETTING)
        return []
    try:
        changes = read()
    except Exception as err:  # the list helps; a job must not fail for want of it
        log.warning("job %s starts without the fleet blocklist: %s", job.job_id, err)
        return []
    applied = blocks_to_apply(
        changes,
        job.hosts,
        job.pool.blocked(),
        job.max_blocked_fraction,
        job.now(),
    )
    for entry in applied:
        assert entry.until_ts is not None
        job.block_host(entry.host, entry.until_ts, entry.fleet_cause(), entry.id)
    return applied
