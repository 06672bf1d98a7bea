"""The instances of a service: their names, and how many of each to run.

A service may run as several instances in its consumer group (`tailguard services up
--instances N`), which share its input topic's partitions (docs/services.md#scale-out). The
first is named for the service (`detector`), the others `detector-2`, `detector-3`...: each
instance's files (state file, log, snapshot, stop report) are under its own name, and all of
them are one consumer group, the service's (`Service.group_id`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from tailguard.system.services import SERVICE_NAMES, service_named


class InstancesError(ValueError):
    pass


def instance_name(service: str, instance: int) -> str:
    """The name of a service's `instance` (1, 2, ...)."""
    return service if instance == 1 else f"{service}-{instance}"


def service_of(name: str) -> str | None:
    """The service an instance name belongs to, or None if it names none."""
    if name in SERVICE_NAMES:
        return name
    base, _, number = name.rpartition("-")
    return base if base in SERVICE_NAMES and number.isdigit() and int(number) > 1 else None


def announced(state_files: Iterable[Path]) -> list[str]:
    """The instance names among state files (`<name>.json`), in the table's order, then by
    instance."""
    found = [(service, path.stem) for path in state_files if (service := service_of(path.stem))]
    return [
        name
        for service, name in sorted(
            found, key=lambda at: (SERVICE_NAMES.index(at[0]), len(at[1]), at[1])
        )
    ]


def wanted(
    names: Sequence[str], instances: int, report: Callable[[str], None]
) -> list[tuple[str, int]]:
    """(service, instance) to run: `instances` of each named service that scales out, one of
    the others (`report` says why)."""
    if instances < 1:
        raise InstancesError(f"--instances must be at least 1, not {instances}")
    runs: list[tuple[str, int]] = []
    for name in names:
        why = service_named(name).one_instance_why
        if instances > 1 and why:
            report(f"{name}: one instance only: {why}")
        runs += [(name, k) for k in range(1, 2 if why else instances + 1)]
    return runs
