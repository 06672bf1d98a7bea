"""A pytest run that uses the harness and is killed from outside leaves nothing running.

Each case runs pytest in a subprocess on a generated test that takes the broker fixture and
then waits to be killed, kills that pytest as CI would (SIGTERM; SIGKILL), and checks by pid
and start time (the ledger's `Started`) that the broker it started is gone. Broker only: ~2 s a
case.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from tailguard.testing.leftovers import Started

HOLDING_TEST = """
    import signal

    def test_hold(tailguard_broker):
        print("BROKER", tailguard_broker.pid, flush=True)
        signal.pause()  # until the run is killed
"""


def _environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTEST_ADDOPTS"}}


def _pytest_args(tmp_path: Path, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-q",
        "-s",
        f"--basetemp={tmp_path / 'inner'}",
        f"--tailguard-ledger-dir={tmp_path / 'ledgers'}",
        *args,
    ]


def _holding_broker(tmp_path: Path) -> tuple[subprocess.Popen[str], Started]:
    """pytest running a test that holds the broker fixture; the broker, once it runs."""
    (tmp_path / "test_hold.py").write_text(textwrap.dedent(HOLDING_TEST))
    run = subprocess.Popen(
        _pytest_args(tmp_path, "test_hold.py"),
        cwd=tmp_path,
        env=_environ(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert run.stdout is not None
    seen = []
    for line in run.stdout:  # the test's own line says the broker runs: no polling
        seen.append(line)
        if line.startswith("BROKER "):
            broker = Started.of(int(line.split()[1]), "broker")
            assert broker is not None, "the fixture's broker is not running"
            return run, broker
    run.wait()
    raise AssertionError("the inner pytest ended before its test ran:\n" + "".join(seen))


def test_sigterm_runs_the_teardown_that_stops_the_broker(tmp_path: Path) -> None:
    run, broker = _holding_broker(tmp_path)
    run.send_signal(signal.SIGTERM)
    output, _ = run.communicate(timeout=60)
    assert not broker.running(), f"the broker outlived a SIGTERM'd run:\n{output}"
    assert run.returncode == 2, output  # pytest's "interrupted"
    assert "SIGTERM" in output
    assert not list((tmp_path / "ledgers").glob("session-*")), "a clean end leaves no ledger"


def test_after_a_sigkill_the_next_session_stops_what_it_left(tmp_path: Path) -> None:
    run, broker = _holding_broker(tmp_path)
    run.kill()
    run.wait(timeout=30)
    assert broker.running(), "SIGKILL runs no teardown: the broker is left (or the test is moot)"

    (tmp_path / "test_next.py").write_text("def test_next(tailguard_harness):\n    pass\n")
    after = subprocess.run(
        _pytest_args(tmp_path, "test_next.py"),
        cwd=tmp_path,
        env=_environ(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = after.stdout + after.stderr
    assert after.returncode == 0, output
    assert not broker.running(), f"the next session left the killed run's broker:\n{output}"
    assert "stopped embedded broker 127.0.0.1" in output and f"(pid {broker.pid})" in output
    assert not list((tmp_path / "ledgers").glob("session-*")), "reaped ledgers are deleted"
