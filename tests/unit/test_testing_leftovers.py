"""The harness's ledger: a dead session's processes are stopped, and nothing else is.

Real processes (`sleep`), real pids and create times; the "dead session" names a pid no process
can have.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tailguard.cluster.local import WORKER_CLASS, ClusterState, WorkerState
from tailguard.testing.leftovers import (
    MARK_ENV,
    Ledger,
    LedgerFile,
    Started,
    marked,
    reap,
    reap_session,
)
from tailguard.testing.plugin import Terminated, signals_interrupt


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(["sleep", "300"])
    yield process
    process.kill()
    process.wait()


def _dead_session() -> Started:
    # Above any pid_max (2^22): no process has it.
    return Started(999_999_999, 1.0, "pytest session")


def _ledger(directory: Path, session: Started, *processes: Started) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"session-{session.pid}-1.json"
    path.write_text(LedgerFile(session, list(processes)).to_json())
    return path


def test_a_dead_sessions_process_is_stopped_and_its_ledger_deleted(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    recorded = Started.of(sleeper.pid, "service decider")
    assert recorded is not None
    ledger = _ledger(tmp_path, _dead_session(), recorded)
    lines: list[str] = []
    stopped = reap(tmp_path, report=lines.append)
    assert sleeper.wait(timeout=15) is not None
    assert stopped == [f"service decider (pid {sleeper.pid}), started by pytest session 999999999"]
    assert lines == [f"tailguard harness: stopped {stopped[0]}"]
    assert not ledger.exists()


def test_a_dead_sessions_marked_process_is_stopped_though_no_ledger_line_names_it(
    tmp_path: Path,
) -> None:
    mark = "0123abcd"
    env = {**os.environ, MARK_ENV: mark}
    marked_one = subprocess.Popen(["sleep", "300"], env=env)
    other = subprocess.Popen(["sleep", "300"], env={**os.environ, MARK_ENV: "another-session"})
    try:
        assert marked(mark) == [marked_one.pid]
        tmp_path.mkdir(exist_ok=True)
        ledger = tmp_path / "session-999999999-1.json"
        ledger.write_text(LedgerFile(_dead_session(), mark=mark).to_json())
        stopped = reap_session(ledger, report=lambda _: None)
        assert marked_one.wait(timeout=15) is not None
        assert stopped == [f"sleep 300 (pid {marked_one.pid}), marked by pytest session 999999999"]
        assert other.poll() is None, "another session's process was stopped"
        assert not ledger.exists()
    finally:
        for process in (marked_one, other):
            process.kill()
            process.wait()


def test_a_reused_pid_is_not_signalled(tmp_path: Path, sleeper: subprocess.Popen[bytes]) -> None:
    recorded = Started.of(sleeper.pid, "embedded broker")
    assert recorded is not None
    # The ledger's process started at another time: the pid now belongs to someone else.
    reused = Started(recorded.pid, recorded.created - 60.0, recorded.what)
    _ledger(tmp_path, _dead_session(), reused)
    assert reap(tmp_path, report=lambda _: None) == []
    assert sleeper.poll() is None, "a process no ledger names with its create time was killed"


def test_a_live_sessions_processes_are_left_alone(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    live = Ledger(tmp_path)  # this test's own process is the live session
    live.record(sleeper.pid, "Spark worker 127.0.0.2")
    assert reap(tmp_path, report=lambda _: None) == []
    assert sleeper.poll() is None
    assert live.path.exists()
    # Its own clean end stops what it recorded and still runs, and deletes the ledger.
    assert live.close(report=lambda _: None) == [
        f"Spark worker 127.0.0.2 (pid {sleeper.pid}), started by pytest session "
        f"{live.path.name.split('-')[1]}"
    ]
    assert sleeper.wait(timeout=15) is not None
    assert not live.path.exists()


def test_an_unreadable_ledger_is_removed_with_a_message(tmp_path: Path) -> None:
    broken = tmp_path / "session-1-1.json"
    broken.write_text("{not json")
    lines: list[str] = []
    assert reap(tmp_path, report=lines.append) == []
    assert not broken.exists()
    assert len(lines) == 1 and str(broken) in lines[0] and "unreadable ledger" in lines[0]


def test_sigterm_interrupts_once_and_a_foreign_handler_is_left_alone() -> None:
    def foreign(_signum: int, _frame: object) -> None:
        pass

    # The session's own harness may hold both signals already (it does whenever the run
    # started with them at their default, as CI's does): this test starts from the default.
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, foreign)
    try:
        with signals_interrupt():
            assert signal.getsignal(signal.SIGHUP) is foreign
            with pytest.raises(Terminated, match="SIGTERM"):
                signal.raise_signal(signal.SIGTERM)
            # A second SIGTERM would end the process at once: the default is back.
            assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        assert signal.getsignal(signal.SIGHUP) is foreign
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_an_interrupt_leaves_a_handler_set_after_it_alone() -> None:
    def later(_signum: int, _frame: object) -> None:
        pass

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}
    for sig in before:
        signal.signal(sig, signal.SIG_DFL)
    try:
        with signals_interrupt():
            signal.signal(signal.SIGHUP, later)  # e.g. a test's own, set inside the session
            with pytest.raises(Terminated, match="SIGTERM"):
                signal.raise_signal(signal.SIGTERM)
            assert signal.getsignal(signal.SIGHUP) is later
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_a_cluster_killed_while_starting_is_stopped_through_its_state_file(
    tmp_path: Path,
) -> None:
    # A stand-in for a Spark worker: `LocalCluster.stop` knows a worker by its class name on
    # the command line, and this one has it (a real cluster costs 10-15 s to start).
    worker = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)", WORKER_CLASS], start_new_session=True
    )
    try:
        cluster_dir = tmp_path / "cluster"
        cluster_dir.mkdir()
        state = ClusterState(
            master_url="spark://127.0.0.1:7077",
            web_ui="http://127.0.0.1:8080",
            master_pid=999_999_998,  # the master had died already
            workers=[WorkerState("127.0.0.2", worker.pid, 8081, str(tmp_path / "w.log"))],
            cores=1,
            memory="1g",
            spark_home=str(tmp_path),
            python=sys.executable,
        )
        (cluster_dir / "cluster.json").write_text(state.to_json())
        ledgers = tmp_path / "ledgers"
        ledgers.mkdir()
        dead = LedgerFile(_dead_session(), clusters=[str(cluster_dir)])
        (ledgers / "session-999999999-1.json").write_text(dead.to_json())

        stopped = reap(ledgers, report=lambda _: None)
        assert worker.wait(timeout=15) is not None
        assert stopped == [f"local cluster in {cluster_dir}, started by pytest session 999999999"]
        assert not (cluster_dir / "cluster.json").exists()
    finally:
        worker.kill()
        worker.wait()


def test_a_teardown_after_sigterm_is_cut_off_and_the_limit_ends_with_the_block() -> None:
    # A teardown that hangs (here: sleeps in the block after the interrupt) ends the process
    # with 2 once the limit is up, so the watchdog can stop what is left.
    hung = textwrap.dedent(
        """
        import signal, time
        from tailguard.testing import plugin
        plugin.TEARDOWN_LIMIT_S = 1.0
        with plugin.signals_interrupt():
            try:
                signal.raise_signal(signal.SIGTERM)
            except plugin.Terminated:
                time.sleep(60)
        """
    )
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", hung], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert time.monotonic() - began < 30
    assert "the teardown took over 1 s; ending now" in done.stderr
    # A block that ends in time takes its limit with it: the process goes on.
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with signals_interrupt(), pytest.raises(Terminated):
            signal.raise_signal(signal.SIGTERM)
        limits = [t for t in threading.enumerate() if isinstance(t, threading.Timer)]
        assert not [t for t in limits if t.is_alive() and not t.finished.is_set()]
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
