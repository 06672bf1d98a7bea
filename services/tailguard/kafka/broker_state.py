"""The embedded broker's state file, `<work_dir>/broker.json`: who runs it and where it listens."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from tailguard.processes.supervised import Supervised, read_json, write_json

STATE_FILE = "broker.json"


@dataclass(frozen=True, slots=True)
class BrokerState:
    pid: int
    bootstrap: str
    started_at: float
    # "kafka": Apache Kafka's broker (broker/kafka_server.py); "mock": librdkafka's mock cluster.
    kind: str = "mock"
    # The process's create time (tailguard.processes.supervised): with the pid, its identity;
    # 0 in a state file written before it was recorded.
    created: float = 0.0

    @property
    def port(self) -> int:
        """The port the broker listens on (what a restart after a crash listens on again); 0
        if the recorded address names none."""
        _, _, port = self.bootstrap.rpartition(":")
        return int(port) if port.isdigit() else 0

    def ours(self) -> bool:
        """Whether the recorded broker process still runs: the same pid and create time (a
        state file without one: a broker's command line, `is_broker_command`)."""
        return Supervised(self.pid, self.created).ours(is_broker_command)


def state_path(work_dir: str | Path) -> Path:
    return Path(work_dir) / STATE_FILE


def write_state(work_dir: str | Path, state: BrokerState) -> None:
    """Write the state file atomically: readers see the old file, no file, or the whole new one."""
    write_json(state_path(work_dir), asdict(state))


def read_state(work_dir: str | Path) -> BrokerState | None:
    """The recorded state, or None when there is no (readable) state file."""
    try:
        raw = read_json(state_path(work_dir))
        if raw is None:
            return None
        return BrokerState(
            pid=int(raw["pid"]),
            bootstrap=str(raw["bootstrap"]),
            started_at=float(raw["started_at"]),
            kind=str(raw.get("kind", "mock")),
            created=float(raw.get("created") or 0.0),
        )
    except (ValueError, KeyError, TypeError):
        return None


def remove_state(work_dir: str | Path, *, only_pid: int | None = None) -> None:
    """Remove the state file; with `only_pid`, only if it still describes that process (so a
    broker that exits late never deletes the file of its successor)."""
    if only_pid is not None:
        current = read_state(work_dir)
        if current is not None and current.pid != only_pid:
            return
    state_path(work_dir).unlink(missing_ok=True)


BROKER_MODULE = "tailguard.broker.mock_process"
# The Kafka broker's main class and the settings file only tailguard's embedded one runs with.
KAFKA_MAIN_CLASS = "kafka.Kafka"
KAFKA_PROPERTIES_FILE = "tailguard-kafka.properties"


def is_broker_command(cmdline: list[str]) -> bool:
    """Whether a command line is an embedded broker's: Apache Kafka's `kafka.Kafka` with
    tailguard's settings file, `BROKER_MODULE` (the mock) or `tailguard broker up
    --foreground`."""
    if KAFKA_MAIN_CLASS in cmdline and any(a.endswith(KAFKA_PROPERTIES_FILE) for a in cmdline):
        return True
    return BROKER_MODULE in cmdline or (
        "broker" in cmdline and any("tailguard" in arg for arg in cmdline)
    )


def is_broker_process(pid: int) -> bool:
    """Whether `pid` is alive and is an embedded broker process, by its command line: we must
    never signal a process that is not our broker (a recycled pid)."""
    return Supervised(pid).ours(is_broker_command)
