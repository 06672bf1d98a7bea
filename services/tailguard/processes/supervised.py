"""A supervised process: started detached with its log, written down in an atomically written
state file, checked for health, stopped (SIGTERM, a grace, SIGKILL), and never mistaken for
another process that got its pid.

The embedded broker (`broker/embedded.py`, `kafka/broker_state.py`), the services
(`shell/supervisor.py`) and the local cluster (`cluster/local.py`) each keep a state file of
their own shape, so that `tailguard broker|services|cluster status` can find what another
process started; every one of them is written, read and acted on through this module.

**Is it still ours?** A pid read from a state file may belong, after a crash or a reboot, to a
process we never started, which must never be signalled. A `Supervised` record names its process
by pid *and* create time (psutil's: boot time plus the start ticks, the same value every time it
is read, and later for a later process given the same pid), the identity Jenkins' and systemd's
supervisors use too. A record written by an older release has no create time (0): then the
command-line marker its caller passes (`java ... kafka.Kafka`, a Spark daemon's class) is the
only check, as it was.

Through psutil, not a walk of /proc of our own.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

# How often a wait for a condition another process brings about looks again: processes we did
# not start (`services down` in another shell) give us no exit event to wait on.
POLL_S = 0.05


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write a state file atomically: a reader sees the old file, none, or the whole new one
    (a temporary file in the same directory, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: Path) -> dict[str, Any] | None:
    """A state file's contents; None if there is none. A file that is not a JSON object raises
    ValueError (callers say which file)."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    if not isinstance(raw, dict):
        raise ValueError(f"{path} holds no JSON object")
    return raw


def create_time(pid: int) -> float | None:
    """When the process started (psutil's create time), or None if it is gone. With the pid it
    names one process: the same process always reads the same value, so it is compared
    exactly."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def cmdline(pid: int) -> list[str] | None:
    """Its command line; None if it is gone, [] if it is not ours to read (or a zombie)."""
    try:
        return psutil.Process(pid).cmdline()
    except psutil.NoSuchProcess:
        return None
    except psutil.Error:
        return []


def reap(pid: int) -> None:
    """Collect `pid`'s exit status if it is an exited child of this process, so it does not
    linger as a zombie (a process we did not start is someone else's to reap)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def alive(pid: int) -> bool:
    """Whether a process with this pid exists and is not a zombie (ours reaped first)."""
    if pid <= 0:
        return False
    reap(pid)
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # not ours to look at: it exists
        return True


@dataclass(frozen=True)
class Supervised:
    """One process we started, as its state file records it."""

    pid: int
    # psutil's create time when it was started: with the pid, its identity (0: not recorded).
    created: float = 0.0
    command: tuple[str, ...] = ()
    log: str = ""
    # An HTTP endpoint that answers 200 and "ready" when it is healthy ("": none).
    health_url: str = ""

    @classmethod
    def of(
        cls, pid: int, command: Sequence[str] = (), log: str | Path = "", health_url: str = ""
    ) -> Supervised:
        """The record of the live process `pid` (its create time read now)."""
        return cls(pid, create_time(pid) or 0.0, tuple(command), str(log), health_url)

    def to_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "created": self.created,
            "command": list(self.command),
            "log": self.log,
            "health_url": self.health_url,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Supervised:
        """From a state file's entry; what an older release did not record takes its default."""
        return cls(
            int(raw["pid"]),
            float(raw.get("created") or 0.0),
            tuple(str(arg) for arg in raw.get("command") or ()),
            str(raw.get("log") or ""),
            str(raw.get("health_url") or ""),
        )

    def ours(self, marker: str | Callable[[list[str]], bool] | None = None) -> bool:
        """Alive, and the very process that was recorded: the same create time, and where
        none was recorded (an older state file), a command line that `marker` accepts (a
        string it contains, or a predicate). A process whose command line we may not read
        passes the marker on liveness and create time alone."""
        if not alive(self.pid):
            return False
        if self.created:
            return create_time(self.pid) == self.created
        if marker is None:
            return True
        line = cmdline(self.pid)
        if line is None:
            return False
        if not line:
            return True
        return marker(line) if callable(marker) else marker in line

    def health(self, timeout_s: float = 1.0) -> str:
        """ "ready", or why not: what its health endpoint says ("starting", "broker unreachable
        for 12 s: ..."), or that it does not answer; "ready" if it has no endpoint and runs."""
        if not self.health_url:
            return "ready" if alive(self.pid) else f"pid {self.pid} is not running"
        return http_health(self.health_url, timeout_s)

    def stop(self, grace_s: float = 10.0) -> bool:
        """`stop_all` for this one process; False if it had to be killed."""
        return self.pid not in stop_all([self], grace_s)


def http_health(url: str, timeout_s: float = 1.0) -> str:
    """The body of `url` (a health endpoint's "ready" or reason), or why there is none."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as reply:
            return str(reply.read().decode().strip())
    except urllib.error.HTTPError as refused:
        return str(refused.read().decode().strip() or f"HTTP {refused.code}")
    except (urllib.error.URLError, OSError) as err:
        return f"no answer from {url} ({err})"


def launch(
    argv: Sequence[str],
    log: Path,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start `argv` detached: in a session of its own (it survives the launching shell, its
    terminal and its Ctrl-C), stdin from /dev/null, stdout and stderr appended to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            env=dict(env) if env is not None else None,
            cwd=cwd,
        )


def wait_until(condition: Callable[[], bool], timeout_s: float, poll_s: float = POLL_S) -> bool:
    """Look at `condition()` until it holds or `timeout_s` has passed; whether it held. For
    what another process brings about and tells no one (an exit we are not the parent of, a
    state file written)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)


def wait_gone(pids: Iterable[int], timeout_s: float) -> bool:
    """Until none of `pids` is alive (our own children reaped); True if they all went within
    the timeout."""
    pids = list(pids)
    return wait_until(lambda: not any(alive(p) for p in pids), timeout_s)


def stop_all(processes: Iterable[Supervised], grace_s: float = 10.0) -> set[int]:
    """SIGTERM each of `processes` that is still ours, all at once (each one's clean stop may
    wait on its own round trips: in turn they would add up), then SIGKILL those still running
    after `grace_s`. Returns the pids that had to be killed."""
    running = [p for p in processes if p.ours()]
    for process in running:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGTERM)
    wait_gone((p.pid for p in running), grace_s)
    killed = set()
    for process in running:
        if process.ours():
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)
            killed.add(process.pid)
    wait_gone(killed, 5.0)
    return killed
