"""Process trees: what runs below a supervised process, and stopping all of it (the cluster
launcher, the throttler and the test harness).

Through psutil, not a walk of /proc of our own: the command line, environment, status and start
time of a process are psutil's, with its handling of processes that exit while we look.

A Spark worker's tree is not one process group: PySpark's daemon calls `setpgid(0, 0)`, so its
Python workers leave the Worker's group. Walking parent links is the only way to reach them all.
"""

from __future__ import annotations

import contextlib
import os
import signal

import psutil

from tailguard.processes import supervised

# wait_gone lives with the supervisor; the tree helpers and their callers use it from here too.
from tailguard.processes.supervised import wait_gone as wait_gone


def parent_map() -> dict[int, int]:
    """pid -> parent pid for every live process (one scan, for many `descendants` calls)."""
    return {
        proc.pid: proc.info["ppid"]
        for proc in psutil.process_iter(["ppid"])
        if proc.info["ppid"] is not None  # exited while we were looking
    }


def descendants(root: int, parents: dict[int, int] | None = None) -> list[int]:
    """`root` and every live process below it, root first."""
    parents = parent_map() if parents is None else parents
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    if root not in parents:
        return []
    tree, frontier = [root], [root]
    while frontier:
        nxt = [c for p in frontier for c in children.get(p, [])]
        tree.extend(nxt)
        frontier = nxt
    return tree


def status_of(pid: int) -> str | None:
    """psutil's status (`psutil.STATUS_STOPPED`, `STATUS_ZOMBIE`, ...), or None if it is gone."""
    try:
        return str(psutil.Process(pid).status())
    except psutil.Error:
        return None


def cmdline(pid: int) -> str:
    """The command line, arguments joined by spaces ("" if it is gone or not ours to read)."""
    return " ".join(supervised.cmdline(pid) or ())


def environ(pid: int) -> dict[str, str]:
    """The environment a process started with ({} if it is gone or not ours to read)."""
    try:
        return dict(psutil.Process(pid).environ())
    except psutil.Error:
        return {}


def is_alive(pid: int, marker: str | None = None) -> bool:
    """Alive (not a zombie) and, if `marker` is given, its command line contains it.

    The marker guards against pid reuse where no create time was recorded: a pid read from an
    old state file may now belong to a process we never started, which must not be signalled.
    """
    return supervised.alive(pid) and (marker is None or marker in cmdline(pid))


def signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def terminate_trees(roots: list[int], grace_s: float = 10.0) -> None:
    """SIGCONT, then SIGTERM, then (after `grace_s`) SIGKILL every process in the roots' trees.

    SIGCONT first: a stopped process does not act on SIGTERM until it is resumed.
    """
    parents = parent_map()
    tree = [pid for root in roots for pid in descendants(root, parents)]
    if not tree:
        return
    signal_all(tree, signal.SIGCONT)
    for root in roots:
        # The whole group: the JVM's children that kept its process group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(root, signal.SIGTERM)
    signal_all(tree, signal.SIGTERM)
    if not wait_gone(tree, grace_s):
        signal_all(tree, signal.SIGKILL)
        wait_gone(tree, 5.0)
