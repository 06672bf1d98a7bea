"""The services, declared once: what each reads, which core decides, what it emits.

Everything that runs or re-runs a service reads this table, as pyeventsourcing's `System` or a
faust app's registered agents are the one place a topology is written down:
- the service worker (`tailguard services run NAME`, tailguard.shell.worker) runs an entry's
  core behind the faust shell, and the supervisor and `tailguard services` list its names;
- `tailguard replay` (tailguard.replay.engine) re-runs every entry's core over a recorded log;
- the agent runs the entries marked `local_fallback` itself (agent/driver/fallbacks.py);
- the test harness (`@pytest.mark.tailguard_services(names=...)`) and attach mode (which names
  the services whose commands its Spark build cannot apply) read the names and the outputs;
- `tailguard explain` finds the settings a core reads by running the entry's core.

Adding a service is one entry here plus its core (a pure `handle(record) -> list[record]`). What
it may command or write is a grant of its own, in `tailguard.model.authority`, which the signing
checks read: declaring a service does not let it command jobs (a test checks the two agree).

The order is the order a what-if replay chains the cores in: a service comes after those whose
outputs it reads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from tailguard.blocklist.fleet import FleetBlocklist
from tailguard.decider.policy import ParallelismDecider
from tailguard.detector.policy import SlowTaskDetector
from tailguard.failover.policy import FailoverStrategy
from tailguard.model import records as r
from tailguard.model.config import Settings
from tailguard.model.fleet import FleetBlock
from tailguard.speculator.policy import MAX_TRACKED_JOBS, SpeculationStrategy
from tailguard.system import service_metrics
from tailguard.system.core_metrics import CoreMetric
from tailguard.system.retention import (
    CoreState,
    EveryRecord,
    RecentJobs,
    Retention,
    UntilJobFinished,
)


class Core(Protocol):
    """A decision core: pure, its time taken from the records (see docs/architecture.md)."""

    def handle(self, record: r.Record) -> list[r.Record]: ...

    def metrics(self) -> dict[str, float]: ...


@dataclass(frozen=True)
class Service:
    name: str
    # The one topic it reads: its decisions are a function of that topic's order alone.
    input_topic: str
    core: Callable[[Settings], Core]
    # The record types its core emits; each goes to its type's TOPIC.
    outputs: tuple[type[r.Record], ...] = ()
    # Which input records its core's state still depends on: what a snapshot keeps, so that a
    # restart folds only those and the tail (tailguard.shell.snapshot). Everything unless the
    # service says how its core forgets.
    retention: Callable[[], Retention] = EveryRecord
    # The agent runs this core itself and applies its decision when the service has not answered
    # within the setting `<name>.timeout` (at once with the services off); a replay compares it
    # even for a job that ran without the services.
    local_fallback: bool = False
    # How each key of the core's metrics() is exported (a test checks that every key is listed).
    metrics: tuple[CoreMetric, ...] = ()
    # Why the service must run as one instance, or "" if several in its group may share its
    # topic's partitions (`tailguard services up --instances N`). Records of a job share a key
    # and so a partition: a core whose state is per job decides the same whichever instance
    # owns the job. A core whose decisions for one job read other jobs' records does not.
    one_instance_why: str = ""

    @property
    def scales_out(self) -> bool:
        return not self.one_instance_why

    @property
    def group_id(self) -> str:
        # The consumer group is the service's identity on the broker: a restarted service
        # resumes from the offsets its previous incarnation committed.
        return f"tailguard-{self.name}"

    @property
    def output_kind(self) -> str:
        """What it emits to the log a replay compares: "findings" or "commands"."""
        return "findings" if any(issubclass(t, r.Finding) for t in self.outputs) else "commands"

    @property
    def timeout_key(self) -> str:
        """The setting: how long the agent waits for this service before deciding itself."""
        return f"{self.name}.timeout"


SERVICES: tuple[Service, ...] = (
    Service(
        "detector",
        r.EVENTS_TOPIC,
        SlowTaskDetector,
        outputs=(r.SlowTasksDetected, r.SpeculativeAttemptWon),
        # The core deletes a job at its JobFinished: a snapshot keeps only unfinished jobs' input.
        retention=UntilJobFinished,
        metrics=service_metrics.DETECTOR,
    ),
    Service(
        "speculator",
        r.FINDINGS_TOPIC,
        SpeculationStrategy,
        outputs=(r.LaunchSpeculativeAttempts,),
        # The core keeps its MAX_TRACKED_JOBS most recently active jobs: so does its snapshot.
        retention=lambda: RecentJobs(MAX_TRACKED_JOBS),
        metrics=service_metrics.SPECULATOR,
    ),
    Service(
        "blocklist",
        r.FINDINGS_TOPIC,
        # Each job's blocks, plus the fleet list's changes for `tailguard.blocklist`
        # (blocklist/fleet.py).
        FleetBlocklist.publishing,
        outputs=(r.BlockNodes, r.UnblockNodes, FleetBlock),
        # Its snapshot is the core's state, which the core keeps bounded (CoreState says why not
        # the input it depends on).
        retention=CoreState,
        metrics=service_metrics.BLOCKLIST,
        one_instance_why=(
            "its fleet view counts evidence from every job together, so instances splitting the "
            "findings' partitions would each see part of it and block other hosts than one does"
        ),
    ),
    Service(
        "decider",
        r.EVENTS_TOPIC,
        ParallelismDecider,
        outputs=(r.SetParallelism,),
        retention=UntilJobFinished,
        local_fallback=True,
        metrics=service_metrics.DECIDER,
    ),
    Service(
        "failover",
        r.EVENTS_TOPIC,
        FailoverStrategy,
        outputs=(r.RestartTasks, r.FailJob),
        retention=UntilJobFinished,
        local_fallback=True,
        metrics=service_metrics.FAILOVER,
    ),
)
SERVICE_NAMES: tuple[str, ...] = tuple(s.name for s in SERVICES)


def service_named(name: str, services: tuple[Service, ...] = SERVICES) -> Service:
    """The entry named `name`; a ValueError lists the names there are."""
    found = next((s for s in services if s.name == name), None)
    if found is None:
        known = ", ".join(s.name for s in services)
        raise ValueError(f"unknown service {name!r}; the services are {known}")
    return found


def local_fallbacks(services: tuple[Service, ...] = SERVICES) -> tuple[Service, ...]:
    """The services the agent stands in for when they do not answer."""
    return tuple(s for s in services if s.local_fallback)


def issuer_of(record_type: type[r.Record], services: tuple[Service, ...] = SERVICES) -> str:
    """The service that emits `record_type`, or "" if none does."""
    return next((s.name for s in services if record_type in s.outputs), "")
