"""The embedded broker's state file, `<work_dir>/broker.json`: who runs it and where it listens."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

STATE_FILE = "broker.json"


@dataclass(frozen=True, slots=True)
class BrokerState:
    pid: int
    bootstrap: str
    started_at: float
    # "kafka": Apache Kafka's broker (broker/kafka_server.py); "mock": librdkafka's mock cluster.
    kind: str = "mock"

    @property
    def port(self) -> int:
        """The port the broker listens on (what a restart after a crash listens on again); 0
        if the recorded address names none."""
        _, _, port = self.bootstrap.rpartition(":")
        return int(port) if port.isdigit() else 0


def state_path(work_dir: str | Path) -> Path:
    return Path(work_dir) / STATE_FILE


def write_state(work_dir: str | Path, state: BrokerState) -> None:
    """Write the state file atomically: readers see the old file, no file, or the whole new one."""
    directory = Path(work_dir)
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".broker.", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(asdict(state), handle)
        os.replace(tmp, state_path(directory))
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_state(work_dir: str | Path) -> BrokerState | None:
    """The recorded state, or None when there is no (readable) state file."""
    try:
        raw = json.loads(state_path(work_dir).read_text(encoding="utf-8"))
        return BrokerState(
            pid=int(raw["pid"]),
            bootstrap=str(raw["bootstrap"]),
            started_at=float(raw["started_at"]),
            kind=str(raw.get("kind", "mock")),
        )
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


def remove_state(work_dir: str | Path, *, only_pid: int | None = None) -> None:
    """Remove the state file; with `only_pid`, only if it still describes that process (so a
    broker that exits late never deletes the file of its successor)."""
    if only_pid is not None:
        current = read_state(work_dir)
        if current is not None and current.pid != only_pid:
            return
    state_path(work_dir).unlink(missing_ok=True)


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists and is not a zombie."""
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # not ours to look at: it exists
        return True


BROKER_MODULE = "tailguard.broker.mock_process"
# The Kafka broker's main class and the settings file only tailguard's embedded one runs with.
KAFKA_MAIN_CLASS = "kafka.Kafka"
KAFKA_PROPERTIES_FILE = "tailguard-kafka.properties"


def is_broker_process(pid: int) -> bool:
    """Whether `pid` is alive and is an embedded broker process. Checking the command line
    guards against a recycled pid: we must never signal a process that is not our broker.
    A broker runs as Apache Kafka's `kafka.Kafka` with tailguard's settings file, as
    `BROKER_MODULE` (the mock) or inside `tailguard broker up --foreground`."""
    if not pid_alive(pid):
        return False
    try:
        cmdline = psutil.Process(pid).cmdline()
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # not ours to read: liveness alone
        return True
    if KAFKA_MAIN_CLASS in cmdline and any(a.endswith(KAFKA_PROPERTIES_FILE) for a in cmdline):
        return True
    return BROKER_MODULE in cmdline or (
        "broker" in cmdline and any("tailguard" in arg for arg in cmdline)
    )
