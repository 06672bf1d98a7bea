"""A host's own CPUs on a shared machine: one cgroup CPU quota per worker.

Why: the SIGSTOP throttle (`throttle.py`) slows a node for CPU-bound work only when there are no
more executor cores than CPUs. With 3 one-core workers on 2 CPUs, the paused node's CPU goes to
the other two, and a "5x slow" node cost plain PySpark ~1.26x (design §7): the machine's
capacity did not drop, it moved. A quota per worker fixes the capacity of each: the worker's
whole process tree (its executor JVM and Python workers inherit the group when they fork) gets at
most `cores` CPUs' worth of time per period, however idle the others are. Every worker of a
budgeted cluster gets its share of the machine (`share_cores`), so the workers are hosts of
fixed size, and a slow host is one whose quota is cut by the factor: it loses `1 - 1/factor` of
its capacity, and no other worker can take it up.

The kernel's CFS bandwidth control does the work: cgroup v1's `cpu` controller
(`cpu.cfs_quota_us` over `cpu.cfs_period_us`) or cgroup v2's `cpu.max` ("quota period"),
whichever is mounted and writable (root, or a delegated subtree). `hierarchy()` finds it;
without one, budgets are off and the cluster says so (`LocalCluster(cpu_budgets=True)` refuses
to start rather than pretend).

A timed slowness (`--for`) needs something to lift it when no process of the caller is left:
`python -m tailguard.cluster.cpu_budget --root R --version V --group NAME --cores N --after S`,
run detached, sets the quota back after S seconds (the SIGSTOP throttler's `--for`, for the
quota).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# The CFS period: 100 ms, the kernel's default. A shorter one throttles more smoothly but costs
# more scheduler work; 100 ms is what `docker --cpus` uses too.
PERIOD_US = 100_000
# Below this the kernel refuses a quota (1 ms).
MIN_QUOTA_US = 1_000
V1_ROOT = Path("/sys/fs/cgroup/cpu")
V2_ROOTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified"))
GROUP_PREFIX = "tailguard"


def share_cores(workers: int, cores: int, cpus: int | None = None) -> float:
    """Each worker's CPUs: its own cores, or an equal share of the machine's CPUs when the
    workers' cores outnumber them (3 one-core workers on 2 CPUs: 2/3 of a CPU each)."""
    cpus = cpus if cpus is not None else (os.cpu_count() or 1)
    return min(float(cores), cpus / workers)


@dataclass(frozen=True)
class Hierarchy:
    """A writable cgroup hierarchy with CPU bandwidth control."""

    root: Path
    version: int  # 1 or 2

    def group(self, name: str) -> CpuBudget:
        return CpuBudget(self, name)


def _writable(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK)


def hierarchy() -> Hierarchy | None:
    """The cgroup hierarchy budgets can use here, or None. cgroup v1's `cpu` controller is
    tried first (a v1 mount takes the controller away from v2), then v2 with `cpu` among the
    root's controllers."""
    if _writable(V1_ROOT) and (V1_ROOT / "cpu.cfs_quota_us").exists():
        return Hierarchy(V1_ROOT, 1)
    for root in V2_ROOTS:
        controllers = root / "cgroup.controllers"
        if _writable(root) and controllers.exists() and "cpu" in controllers.read_text().split():
            return Hierarchy(root, 2)
    return None


class BudgetError(RuntimeError):
    """A budget could not be made or changed (no permission, no such group)."""


class CpuBudget:
    """One cgroup with a CPU quota: `cores` CPUs' worth of time per period for its tasks."""

    def __init__(self, hierarchy: Hierarchy, name: str) -> None:
        self.hierarchy = hierarchy
        self.name = name
        self.path = hierarchy.root / name
        self.version = hierarchy.version

    def create(self) -> CpuBudget:
        try:
            if self.version == 2:
                # v2 gives a group the cpu controller only if each ancestor enables it for its
                # children (in `cgroup.subtree_control`).
                ancestor = self.hierarchy.root
                for part in Path(self.name).parts:
                    control = ancestor / "cgroup.subtree_control"
                    if "cpu" not in control.read_text().split():
                        control.write_text("+cpu")
                    ancestor = ancestor / part
                    ancestor.mkdir(exist_ok=True)
            else:
                self.path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise BudgetError(f"cannot create the cgroup {self.path}: {err}") from err
        return self

    def set_cores(self, cores: float) -> None:
        """At most `cores` CPUs' worth of time per period (0 < cores)."""
        if not cores > 0:
            raise ValueError(f"a CPU budget needs a positive number of cores, got {cores}")
        quota = max(MIN_QUOTA_US, round(cores * PERIOD_US))
        try:
            if self.version == 1:
                (self.path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
                (self.path / "cpu.cfs_quota_us").write_text(str(quota))
            else:
                (self.path / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        except OSError as err:
            raise BudgetError(f"cannot set the CPU quota of {self.path}: {err}") from err

    def cores(self) -> float | None:
        """The quota in CPUs, None when unlimited."""
        if self.version == 1:
            quota = int((self.path / "cpu.cfs_quota_us").read_text())
            period = int((self.path / "cpu.cfs_period_us").read_text())
            return None if quota < 0 else quota / period
        quota_text, period_text = (self.path / "cpu.max").read_text().split()
        return None if quota_text == "max" else int(quota_text) / int(period_text)

    def add(self, pid: int) -> None:
        """Move process `pid` (all its threads) into the group; what it forks later is born in
        it."""
        try:
            (self.path / "cgroup.procs").write_text(str(pid))
        except OSError as err:
            raise BudgetError(f"cannot move process {pid} into {self.path}: {err}") from err

    def pids(self) -> list[int]:
        with contextlib.suppress(OSError):
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        return []

    def remove(self) -> None:
        """Delete the group, moving any process still in it to the hierarchy's root first (a
        cgroup with members cannot be removed)."""
        if not self.path.exists():
            return
        root = self.hierarchy.root
        for pid in self.pids():
            with contextlib.suppress(OSError):
                (root / "cgroup.procs").write_text(str(pid))
        with contextlib.suppress(OSError):
            self.path.rmdir()
        # Its parents (tailguard/<cluster>) go too once empty; a sibling keeps them.
        for parent in self.path.parents:
            if parent == root or not parent.name:
                break
            try:
                parent.rmdir()
            except OSError:
                break


def group_name(work_dir: Path, host: str) -> str:
    """A worker's group, unique per cluster (its work dir) and host."""
    cluster = hashlib.sha256(str(work_dir.resolve()).encode()).hexdigest()[:12]
    return f"{GROUP_PREFIX}/{cluster}/{host}"


def main(argv: Sequence[str] | None = None) -> int:
    """Set a group's quota back to `--cores` after `--after` seconds (a timed slowness)."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--root", required=True, type=Path)
    parser.add_argument("--version", type=int, choices=(1, 2), required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--cores", type=float, required=True)
    parser.add_argument("--after", type=float, required=True)
    args = parser.parse_args(argv)
    time.sleep(args.after)  # the whole job of this process: wait out the slowness, then lift it
    budget = Hierarchy(args.root, args.version).group(args.group)
    if budget.path.exists():
        budget.set_cores(args.cores)
    return 0


if __name__ == "__main__":
    sys.exit(main())
