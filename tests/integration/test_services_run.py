"""`tailguard services run NAME`: one service in the foreground, as a container runs it.

The process started is the service itself (no child, no detaching), it answers on its metrics
port, `services status` sees it, and SIGTERM (what `docker stop` sends) ends it cleanly.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tailguard.shell import supervisor
from tailguard.testing import Broker

pytestmark = pytest.mark.slow


@pytest.fixture
def work(tmp_path: Path, tailguard_broker: Broker, monkeypatch: pytest.MonkeyPatch) -> Path:
    # The session's broker, as a container is pointed at its cluster: by the environment.
    monkeypatch.setenv("TAILGUARD_BOOTSTRAP_SERVERS", tailguard_broker.bootstrap)
    return tmp_path


def tailguard(*argv: str) -> list[str]:
    return [sys.executable, "-m", "tailguard.cli", *argv]


def test_run_serves_one_service_in_the_foreground_until_sigterm(work: Path) -> None:
    process = subprocess.Popen(
        tailguard("services", "run", "detector", "--work-dir", str(work)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    announced = work / "services" / "detector.json"
    try:
        # The service announces itself once its metrics endpoint listens; polled, as
        # `services up` does: a process in the foreground has no other way to call back.
        deadline = time.monotonic() + 60
        while not announced.exists():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "detector never announced itself"
            time.sleep(0.1)
        state = json.loads(announced.read_text())
        assert state["pid"] == process.pid  # the service is this process, not a child of it
        running = supervisor.running(work)["detector"]
        while not running.healthy():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "detector never became ready"
            time.sleep(0.1)
        with urllib.request.urlopen(f"{running.metrics_url}/metrics", timeout=5) as reply:
            assert "tailguard_" in reply.read().decode()
        status = subprocess.run(
            tailguard("services", "status", "--only", "detector", "--work-dir", str(work)),
            capture_output=True,
            text=True,
            check=False,
        )
        assert status.returncode == 0 and f"pid {process.pid}" in status.stdout, status
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, err
    assert "detector" in err  # it logs to standard error, where a container's log is read


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["run"], "run needs a NAME: one of detector"),
        (["run", "planner"], "'planner' is not a service"),
        (["down", "detector"], "NAME goes with run; down takes --only detector"),
    ],
)
def test_run_and_the_other_verbs_refuse_a_wrong_name(
    tmp_path: Path, argv: list[str], problem: str
) -> None:
    done = subprocess.run(
        tailguard("services", *argv, "--work-dir", str(tmp_path)),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and problem in done.stderr, done
