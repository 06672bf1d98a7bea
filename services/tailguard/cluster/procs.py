"""Process-tree helpers shared by the cluster launcher and the throttler (Linux /proc only).

A Spark worker's tree is not one process group: PySpark's daemon calls `setpgid(0, 0)`, so its
Python workers leave the Worker's group. Walking parent links is the only way to reach them all.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

_PROC = Path("/proc")


def parent_map() -> dict[int, int]:
    """pid -> parent pid for every live process."""
    parents: dict[int, int] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # exited while we were looking
            continue
        # The command name is in parentheses and may itself contain spaces or ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        parents[int(entry.name)] = int(fields[1])
    return parents


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


def state_of(pid: int) -> str | None:
    """The one-letter scheduler state (R, S, T, Z, ...) or None if the process is gone."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2]


def start_ticks(pid: int) -> int | None:
    """When the process started, in clock ticks since boot (stat's `starttime`), or None if it
    is gone. With the pid it names one process: a later process given the same pid starts later."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rfind(")") + 2 :].split()[19])  # field 22; the state is field 3


def cmdline(pid: int) -> str:
    try:
        # A command line need not be UTF-8 (arguments are bytes): a lookup by marker must not fail.
        raw = (_PROC / str(pid) / "cmdline").read_bytes()
        return raw.replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def environ(pid: int) -> dict[str, str]:
    """The environment a process started with ({} if it is gone or not ours to read)."""
    try:
        raw = (_PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, _, v in pairs}


def is_alive(pid: int, marker: str | None = None) -> bool:
    """Alive (not a zombie) and, if `marker` is given, its command line contains it.

    The marker guards against pid reuse: a pid read from an old state file may now belong to a
    process we never started, which must not be signalled.
    """
    state = state_of(pid)
    if state is None or state in "ZX":
        return False
    return marker is None or marker in cmdline(pid)


def signal_all(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def wait_gone(pids: list[int], timeout_s: float) -> bool:
    """Poll until none of `pids` is alive; True if they all went within the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        for pid in pids:
            # Reap our own children so they do not linger as zombies.
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        if not any(is_alive(p) for p in pids):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


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
