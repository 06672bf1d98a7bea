"""Where a run's CPU went, by part: the control plane (the broker and the services), the
executors (every worker's process tree: executor JVMs, their Python workers) and the driver (the
Spark driver JVM with its children, the attached relay among them).

On this benchmark's machine every part shares 2 cores, so a contender that costs the control
plane or the driver CPU slows its own executors. These figures say which part an overhead is
in; on a real cluster the services and the broker run on other machines.

A process's CPU time here is its own (user + system) plus that of its children it has reaped:
a Python worker or a relay that ended inside the run is counted in its parent, and one alive at
either sample in itself, so no second is counted twice. Sampled before and after the job, the
difference is the job's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import psutil

from tailguard.processes.trees import descendants, parent_map


def _process_cpu_s(pid: int) -> float:
    try:
        t = psutil.Process(pid).cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return 0.0  # gone since the tree was listed: its time is in its parent's children
    return t.user + t.system + t.children_user + t.children_system


def trees_cpu_s(roots: Iterable[int], parents: dict[int, int] | None = None) -> float:
    """CPU seconds of the live processes under `roots` (themselves included), each once."""
    tree = parent_map() if parents is None else parents
    pids = {pid for root in roots for pid in descendants(root, tree)}
    return sum(_process_cpu_s(pid) for pid in pids)


@dataclass(frozen=True)
class CpuRoots:
    """The root processes of each part, as the bench knows them: the control plane's by name
    (the broker, each service), each reported on its own as well as in the part's total."""

    control_plane: Mapping[str, int]
    executors: tuple[int, ...]
    driver: tuple[int, ...]

    def sample(self) -> dict[str, float]:
        """CPU seconds so far, per part and per control-plane process (one process table
        read; each tree walked once)."""
        tree = parent_map()
        named = {
            f"control_plane.{name}": trees_cpu_s((pid,), tree)
            for name, pid in self.control_plane.items()
        }
        return {
            "control_plane": sum(named.values()),
            "executors": trees_cpu_s(self.executors, tree),
            "driver": trees_cpu_s(self.driver, tree),
            **named,
        }


def used(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """What each part (and named process) used between two samples, rounded to 10 ms."""
    return {key: round(after[key] - before[key], 2) for key in before if key in after}
