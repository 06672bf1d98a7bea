"""The pytest plugin as a user meets it: pytest in a subprocess on a generated test file, with
the plugin loaded from the installed package (its pytest11 entry point).

No Spark here (the sample project's test starts Spark through the plugin): what the fixtures
start and stop, a misused marker or option, a missing JDK.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tailguard.broker.embedded import EmbeddedBroker
from tailguard.kafka.broker_state import is_broker_process


def pytest_in(
    directory: Path, test: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    (directory / "test_generated.py").write_text(textwrap.dedent(test))
    environ = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTEST_ADDOPTS"}}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", *args],
        cwd=directory,
        env={**environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_the_broker_fixture_stops_the_broker_it_started(tmp_path: Path) -> None:
    done = pytest_in(
        tmp_path,
        """
        def test_broker(tailguard_broker):
            assert tailguard_broker.started_here and tailguard_broker.bootstrap
            print("PID", tailguard_broker.pid)
        """,
        "-s",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    pid = int(done.stdout.split("PID ")[1].split()[0])
    assert not is_broker_process(pid), "the broker the fixture started is still running"
    assert "embedded broker" in done.stdout  # the summary of what the harness started


@pytest.mark.long
def test_a_broker_already_running_in_the_work_dir_is_used_and_left_running(
    tmp_path: Path,
) -> None:
    root = tmp_path / "state"
    running = EmbeddedBroker(root / "broker")
    bootstrap = running.start()
    try:
        done = pytest_in(
            tmp_path,
            f"""
            def test_broker(tailguard_broker):
                assert tailguard_broker.bootstrap == {bootstrap!r}
                assert not tailguard_broker.started_here
            """,
            f"--tailguard-work-dir={root}",
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert running.status() is not None, "the plugin stopped a broker it did not start"
        assert "tailguard harness" not in done.stdout  # it started nothing
    finally:
        running.stop()


def test_a_misused_marker_fails_the_test_with_what_is_allowed(tmp_path: Path) -> None:
    done = pytest_in(
        tmp_path,
        """
        import pytest

        @pytest.mark.tailguard_cluster(workers=3, slow={"127.0.0.9": 5})
        def test_cluster(tailguard_cluster):
            pass
        """,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        "@pytest.mark.tailguard_cluster(slow=): '127.0.0.9' is not a worker of this cluster; "
        "its workers are 127.0.0.2, 127.0.0.3, 127.0.0.4"
    ) in done.stdout
    assert "cluster (" not in done.stdout  # nothing was started for it


def test_a_bad_option_is_a_usage_error(tmp_path: Path) -> None:
    done = pytest_in(
        tmp_path, "def test_x(tailguard_harness):\n    pass\n", "--tailguard-workers=two"
    )
    assert done.returncode == 4, done.stdout + done.stderr
    assert "tailguard_workers must be a whole number of at least 1, got 'two'" in done.stderr


@pytest.mark.long
def test_without_a_jdk_spark_tests_are_skipped_with_the_reason(tmp_path: Path) -> None:
    # Only the venv's own commands on PATH, no JAVA_HOME: no `java` to find.
    venv_bin = str(Path(sys.executable).parent)
    done = pytest_in(
        tmp_path,
        """
        def test_local(tailguard_local_spark):
            raise AssertionError("ran without a JDK")

        def test_cluster(tailguard_spark):
            raise AssertionError("ran without a JDK")
        """,
        env={"PATH": venv_bin, "JAVA_HOME": ""},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 skipped" in done.stdout
    assert "`java` not found" in done.stdout


@pytest.mark.long
@pytest.mark.parametrize("marker", ["tailguard_cluster", "tailguard_spark", "tailguard_services"])
def test_the_markers_are_registered(tmp_path: Path, marker: str) -> None:
    done = pytest_in(tmp_path, "def test_x():\n    pass\n", "--markers")
    assert f"@pytest.mark.{marker}(" in done.stdout
