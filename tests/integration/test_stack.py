"""One stack bring-up (tailguard.stack) and `tailguard stack up|status|down`: the parts asked
for come up in order with a line each, a part that fails is named with its log and what was
started before it is stopped again, and `down` leaves nothing running.

On the mock broker, without the cluster: what is tested is the bring-up, not Kafka or Spark
(the demo, the bench and the harness run it with both).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tailguard import stack
from tailguard.broker.embedded import EmbeddedBroker
from tailguard.cli import main
from tailguard.shell import supervisor
from tailguard.system.services import SERVICE_NAMES

pytestmark = pytest.mark.slow  # the five services' start


def tailguard(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """`tailguard ARGS` in this process: its exit status and what it printed."""
    status = main(list(args))
    return status, capsys.readouterr().out


def test_stack_up_status_down(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no ./tailguard.toml but the test's
    work = tmp_path / "w"
    common = ("--work-dir", str(work))
    try:
        status, out = tailguard(capsys, "stack", "up", "--mock", "--no-cluster", *common)
        assert status == 0, out
        lines = out.splitlines()
        # In order: the broker, then each service, each with its line.
        broker_line = next(i for i, line in enumerate(lines) if line.startswith("broker at "))
        for name in SERVICE_NAMES:
            ready = f"service {name}: ready"
            assert next(i for i, line in enumerate(lines) if line.startswith(ready)) > broker_line
        assert "stop it with: tailguard stack down" in lines[-1]
        assert set(supervisor.running(work)) == set(SERVICE_NAMES)

        status, out = tailguard(capsys, "stack", "status", *common)
        assert status == 1  # no cluster
        said = dict(line.split(": ", 1) for line in out.splitlines())
        assert said["broker"].startswith("pid ")
        assert all(f"{name} ready" in said["services"] for name in SERVICE_NAMES)
        assert said["cluster"] == "not running"

        status, out = tailguard(capsys, "stack", "down", *common)
        assert status == 0, out
        assert "broker stopped" in out
        assert supervisor.running(work) == {}
        assert EmbeddedBroker(work).status() is None
        status, out = tailguard(capsys, "stack", "status", *common)
        assert status == 1 and "broker: not running" in out
    finally:
        stack.down_all(work)


def test_a_failing_part_is_named_with_its_log_and_what_came_up_before_is_stopped(
    tmp_path: Path,
) -> None:
    said: list[str] = []
    # The detector cannot start: its settings file does not exist.
    request = stack.StackRequest(
        tmp_path, mock_broker=True, services=("detector",), config=tmp_path / "missing.toml"
    )
    try:
        with pytest.raises(stack.StackError) as failed:
            stack.up(request, said.append)
        assert failed.value.part == stack.SERVICES
        log = supervisor.services_dir(tmp_path) / "detector.log"
        assert str(log) in str(failed.value)
        assert "settings file not found" in log.read_text()
        # The broker it started first is stopped again, and says so.
        assert any(line.startswith("broker at ") for line in said)
        assert said[-1] == "broker stopped"
        assert EmbeddedBroker(tmp_path).status() is None
    finally:
        stack.down_all(tmp_path)


def test_a_failing_cluster_stops_the_services_and_the_broker_started_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No JDK to be found: the cluster, the last part, fails at once.
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    monkeypatch.setenv("PATH", str(tmp_path))
    said: list[str] = []
    request = stack.StackRequest(
        tmp_path, mock_broker=True, services=("detector",), cluster=stack.ClusterSpec(1)
    )
    try:
        with pytest.raises(stack.StackError) as failed:
            stack.up(request, said.append)
        assert failed.value.part == stack.CLUSTER
        assert "`java` not found" in str(failed.value)
        assert str(tmp_path / "cluster" / "logs") in str(failed.value)
        # Newest first: the service, then the broker, each with its line.
        stopped = [line for line in said if "stopped" in line]
        assert stopped == ["service detector: stopped", "broker stopped"], said
        assert supervisor.running(tmp_path) == {}
        assert EmbeddedBroker(tmp_path).status() is None
    finally:
        stack.down_all(tmp_path)
