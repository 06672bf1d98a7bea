"""What a service is, to the shell: a name, its one input topic, and its core."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from tailguard.model import records as r
from tailguard.model.config import Settings
from tailguard.shell.core_metrics import CoreMetric
from tailguard.shell.retention import EveryRecord, Retention


class Core(Protocol):
    def handle(self, record: r.Record) -> list[r.Record]: ...

    def metrics(self) -> dict[str, float]: ...


@dataclass(frozen=True)
class ServiceDefinition:
    name: str
    input_topic: str
    core: Callable[[Settings], Core]
    # How each key of the core's metrics() is exported (a test checks that every key is listed).
    metrics: tuple[CoreMetric, ...] = ()
    # Outputs that go to a topic of their own, not in the records' encoding: record type ->
    # (key, value or None for a tombstone). The blocklist's fleet list uses it.
    encoders: Mapping[type[r.Record], Callable[[r.Record], tuple[bytes, bytes | None]]] = field(
        default_factory=dict
    )
    # Which input records its core's state still depends on: what a snapshot keeps, so that a
    # restart folds only those and the tail (tailguard.shell.snapshot). Everything unless the
    # service says how its core forgets.
    retention: Callable[[], Retention] = EveryRecord

    @property
    def group_id(self) -> str:
        # The consumer group is the service's identity on the broker: a restarted service
        # resumes from the offsets its previous incarnation committed.
        return f"tailguard-{self.name}"


# name -> module holding its DEFINITION (imported on demand: each service imports only its own
# package, so the services stay independent of one another).
SERVICE_MODULES: dict[str, str] = {
    "detector": "tailguard.detector.service",
    "speculator": "tailguard.speculator.service",
    "blocklist": "tailguard.blocklist.service",
    "decider": "tailguard.decider.service",
    "failover": "tailguard.failover.service",
}
SERVICE_NAMES: tuple[str, ...] = tuple(SERVICE_MODULES)


def load_definition(name: str) -> ServiceDefinition:
    try:
        module = importlib.import_module(SERVICE_MODULES[name])
    except KeyError:
        raise ValueError(
            f"unknown service {name!r}; the services are {', '.join(SERVICE_NAMES)}"
        ) from None
    definition = module.DEFINITION
    assert isinstance(definition, ServiceDefinition)
    return definition
