"""What a pytest session's harness started, kept on disk, so that nothing outlives a killed run.

A pytest run killed with SIGKILL (a CI job cancelled or timed out, the OOM killer) runs no
fixture teardown: the embedded broker, the Spark daemons and the services it started would keep
running for hours (five orphaned services were found 90 minutes after such a run). So the harness
writes down every process it starts as soon as it has the pid, in a **ledger**: one JSON file per
pytest session in a per-user directory, naming the session's own process and each started
process by pid *and* create time (`tailguard.processes.supervised`), because a pid alone may
belong to another process by the time anyone reads the file. A local cluster is also named by its
state directory before it starts, since a run killed while the cluster starts has no pids to
record yet.

Whatever starts them, the session's processes also carry its **mark**: the plugin puts a random
token in the session's environment (`TAILGUARD_HARNESS_SESSION`), which every process started
from it inherits - the broker's JVM, the Spark daemons, the services, what they start in turn -
so a dead session's processes are found by it even where no ledger line names them (a kind of
process the harness learns to start later, one started by a test). Jenkins finds a build's
leftovers the same way (its ProcessTreeKiller's cookie).

A dead session is cleaned up twice over: by its **watchdog** (tailguard.testing.watchdog), a
process started with the ledger that outlives the session and acts the moment it ends, and by
the next session that uses the harness, which reads every ledger whose session is dead. Either
stops what is still running of it, with the process trees below (a Spark worker's executors and
Python workers), then deletes the ledger. It stops nothing else: a process is stopped only if a
ledger names it with the same create time or it carries the dead session's mark, and a cluster
only through its own state file (whose pids are checked against the Spark class names). SIGTERM
is the plugin's business: it makes teardown run (`tailguard.testing.plugin`).

    python -m tailguard.testing.leftovers [DIR]   # reap now (a CI job's cleanup step)
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from tailguard.processes import supervised, trees

log = logging.getLogger("tailguard.testing")

# Overrides the per-user default directory (so does the `tailguard_ledger_dir` option).
LEDGER_DIR_ENV = "TAILGUARD_HARNESS_LEDGERS"
# The session's mark, inherited by every process started from it.
MARK_ENV = "TAILGUARD_HARNESS_SESSION"
# A stopped process gets this long after SIGTERM before SIGKILL: the services write their last
# snapshot on SIGTERM, the JVMs stop their children.
STOP_GRACE_S = 10.0


def default_ledger_dir() -> Path:
    """Per user, not per run: the next session must find a killed one's ledger whatever its
    pytest base temp dir was (a new `pytest-N`, `--basetemp`, another checkout)."""
    configured = os.environ.get(LEDGER_DIR_ENV, "").strip()
    if configured:
        return Path(configured)
    return Path(tempfile.gettempdir()) / f"tailguard-harness-{os.getuid()}"


@dataclass(frozen=True)
class Started:
    """One process a session started: which, when it started (to tell a reused pid), and what."""

    pid: int
    # Its create time (supervised.create_time): the same process always reads the same value.
    created: float
    what: str

    @classmethod
    def of(cls, pid: int, what: str) -> Started | None:
        """The live process `pid`; None if it is already gone."""
        created = supervised.create_time(pid)
        return None if created is None else cls(pid, created, what)

    def running(self) -> bool:
        """Whether this very process still runs (not another one that got its pid)."""
        return supervised.Supervised(self.pid, self.created).ours()


@dataclass
class LedgerFile:
    """What one ledger file holds."""

    session: Started
    processes: list[Started] = field(default_factory=list)
    clusters: list[str] = field(default_factory=list)  # local clusters' state directories
    mark: str = ""  # the session's MARK_ENV value ("" in an older release's ledger)
    watchdog: Started | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> LedgerFile:
        raw = json.loads(text)
        watchdog = raw.get("watchdog")
        return cls(
            Started(**raw["session"]),
            [Started(**p) for p in raw["processes"]],
            [str(c) for c in raw["clusters"]],
            str(raw.get("mark", "")),
            Started(**watchdog) if watchdog else None,
        )


class Ledger:
    """This session's ledger: `record` each process as it starts; `close` at a clean end."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        me = Started.of(os.getpid(), "pytest session")
        assert me is not None  # this process runs
        self._file = LedgerFile(me, mark=secrets.token_hex(12))
        self.path = self.directory / f"session-{me.pid}-{int(me.created * 1000)}.json"
        # Written at once: a session that is gone while its ledger is still there did not end
        # cleanly, whatever it had recorded (its marked processes are to be stopped).
        self._write()

    @property
    def mark(self) -> str:
        """The session's mark: set it as `MARK_ENV` in the session's environment."""
        return self._file.mark

    def record_watchdog(self, pid: int) -> None:
        self._file.watchdog = Started.of(pid, "harness watchdog")
        self._write()

    def record(self, pid: int, what: str) -> None:
        """Write down a process this session started (before anything else can go wrong)."""
        started = Started.of(pid, what)
        if started is not None:
            self._file.processes.append(started)
            self._write()

    def record_cluster(self, state_dir: Path) -> None:
        """Write down a local cluster's directory before it starts: a kill during the start
        leaves daemons whose pids only its state file knows."""
        if str(state_dir) not in self._file.clusters:
            self._file.clusters.append(str(state_dir))
            self._write()

    def _write(self) -> None:
        # A reader sees the old ledger or the new one, never half.
        supervised.write_json(self.path, asdict(self._file))

    def close(self, report: Callable[[str], None] = log.warning) -> list[str]:
        """At the session's end, after the harness stopped what it started: stop whatever it
        recorded that still runs (a stop that failed, a process started while a signal
        interrupted the harness), then delete the ledger. What was stopped, described."""
        # Not by its mark: this session runs, and so do its own marked processes (its Spark
        # driver's JVM, for one) until it ends.
        stopped = _stop(self._file, report, by_mark=False)
        self.path.unlink(missing_ok=True)
        return stopped


def reap(directory: Path, report: Callable[[str], None] = log.warning) -> list[str]:
    """Stop what the dead sessions recorded in `directory` still runs, and delete their ledgers.
    What was stopped, described (also passed to `report`, one line each)."""
    stopped: list[str] = []
    if not directory.is_dir():
        return stopped
    for path in sorted(directory.glob("session-*.json")):
        stopped += reap_session(path, report)
    return stopped


def reap_session(path: Path, report: Callable[[str], None] = log.warning) -> list[str]:
    """`reap` for one ledger: if its session is dead, stop what it left and delete the ledger
    (a clean end deleted it already: nothing to do). What was stopped, described."""
    try:
        ledger = LedgerFile.from_json(path.read_text())
    except FileNotFoundError:
        return []  # ended cleanly, or another session (or the watchdog) reaped it meanwhile
    except (ValueError, KeyError, TypeError) as err:
        report(f"tailguard harness: unreadable ledger {path} removed ({err})")
        path.unlink(missing_ok=True)
        return []
    if ledger.session.running():
        return []  # a session still at work (this one, or a concurrent run)
    stopped = _stop(ledger, report, by_mark=True)
    path.unlink(missing_ok=True)
    return stopped


def marked(mark: str) -> list[int]:
    """The live processes that carry `mark` in their environment (other users' processes,
    which psutil may not read, carry none of ours)."""
    if not mark:
        return []
    found = []
    for proc in psutil.process_iter(["environ"]):
        environ = proc.info["environ"] or {}
        if environ.get(MARK_ENV) == mark and proc.pid != os.getpid():
            found.append(proc.pid)
    return found


def _stop(ledger: LedgerFile, report: Callable[[str], None], *, by_mark: bool) -> list[str]:
    session = f"pytest session {ledger.session.pid}"
    alive = [p for p in ledger.processes if p.running()]
    stopped = [f"{p.what} (pid {p.pid}), started by {session}" for p in alive]
    # Newest first, as the harness itself stops them: the services before their broker.
    trees.terminate_trees([p.pid for p in reversed(alive)], STOP_GRACE_S)
    for state_dir in ledger.clusters:
        stopped += _stop_cluster(Path(state_dir), session)
    if by_mark:
        # Whatever else the session started (and its trees): nothing a ledger line names.
        rest = marked(ledger.mark)
        stopped += [f"{trees.cmdline(pid)[:120]} (pid {pid}), marked by {session}" for pid in rest]
        trees.terminate_trees(rest, STOP_GRACE_S)
    for line in stopped:
        report(f"tailguard harness: stopped {line}")
    return stopped


def _stop_cluster(state_dir: Path, session: str) -> list[str]:
    """Whatever the cluster's state file still names; `LocalCluster.stop` checks each pid
    against the Spark daemon's class name before signalling it."""
    if not (state_dir / "cluster.json").exists():
        return []
    from tailguard.cluster.local import ClusterError, LocalCluster

    try:
        local = LocalCluster.attach(state_dir)
    except ClusterError:
        return []  # an unreadable state file names nothing to stop
    state = local.state
    assert state is not None  # attach read it
    anything = state.master_ours() or any(w.ours() for w in state.workers)
    local.stop(grace_s=STOP_GRACE_S)  # also removes the state file of a cluster already dead
    return [f"local cluster in {state_dir}, started by {session}"] if anything else []


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    directory = Path(args[0]) if args else default_ledger_dir()
    stopped = reap(directory, report=print)
    if not stopped:
        print(f"nothing left running by a dead pytest session (ledgers in {directory})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
