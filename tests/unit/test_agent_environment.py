"""Where the runners' executors are, how they reach the driver, and whether they can run this
tailguard: the pure decisions behind `session_builder`, the runner listener and the executor
check at job start (the check on a real local[2] session is in
tests/integration/test_executor_environment.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tailguard.agent.executor import environment
from tailguard.agent.executor.environment import incompatibilities, tailguard_build, this_python


@pytest.mark.parametrize(
    ("master", "here"),
    [
        ("local", True),
        ("local[2]", True),
        ("local[*]", True),
        ("local-cluster[2,1,1024]", True),
        ("spark://127.0.0.1:7077", True),
        ("spark://127.0.0.2:7077,127.0.0.3:7077", True),  # a standby master, also local
        ("spark://localhost:7077", True),
        ("spark://[::1]:7077", True),
        ("spark://10.147.0.2:7077", False),
        ("spark://master.example.internal:7077", False),  # a name may resolve anywhere
        ("spark://127.0.0.1:7077,10.0.0.5:7077", False),
        ("yarn", False),
        ("k8s://https://127.0.0.1:6443", False),  # an API server through a tunnel
    ],
)
def test_which_masters_have_every_executor_on_this_machine(master: str, here: bool) -> None:
    pytest.importorskip("pyspark")
    from tailguard.agent.adapters.spark import executors_on_this_machine

    assert executors_on_this_machine(master) is here


def test_session_builder_leaves_the_driver_address_and_python_to_the_user_off_this_machine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("pyspark")
    from tailguard.agent.adapters import spark

    # Set, then removed: the undo then restores whatever was there, even nothing.
    monkeypatch.setenv("PYSPARK_PYTHON", "placeholder")
    monkeypatch.delenv("PYSPARK_PYTHON")
    remote = spark.session_builder("spark://10.147.0.2:7077")._options
    assert "spark.driver.host" not in remote and "spark.driver.bindAddress" not in remote
    assert "PYSPARK_PYTHON" not in os.environ
    assert {k: remote[k] for k in spark.REQUIRED_CONF} == spark.REQUIRED_CONF

    local_cluster = spark.session_builder("spark://127.0.0.1:7077")._options
    assert local_cluster["spark.driver.host"] == "127.0.0.1"
    assert os.environ["PYSPARK_PYTHON"] == sys.executable


def test_session_builder_keeps_a_python_the_user_chose(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pyspark")
    from tailguard.agent.adapters import spark

    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/env/bin/python")
    spark.session_builder("local[2]")
    assert os.environ["PYSPARK_PYTHON"] == "/opt/env/bin/python"


@pytest.mark.parametrize(
    ("conf", "local", "expected"),
    [
        ({}, True, ("127.0.0.1", "127.0.0.1")),
        ({"spark.driver.host": "10.147.0.10"}, False, ("10.147.0.10", "10.147.0.10")),
        # Kubernetes: the pod binds its own IP and advertises the service name.
        (
            {"spark.driver.host": "app-driver-svc.ns.svc", "spark.driver.bindAddress": "10.1.2.3"},
            False,
            ("10.1.2.3", "app-driver-svc.ns.svc"),
        ),
        (
            {"spark.driver.host": "10.147.0.10", "spark.driver.bindAddress": "0.0.0.0"},
            False,
            ("0.0.0.0", "10.147.0.10"),
        ),
    ],
)
def test_runner_listener_binds_and_advertises_as_spark_does(
    conf: dict[str, str], local: bool, expected: tuple[str, str]
) -> None:
    pytest.importorskip("pyspark")
    from tailguard.agent.adapters.spark import runner_listen_address

    assert runner_listen_address(conf, local) == expected


def test_runner_listener_without_a_driver_host_is_an_error() -> None:
    pytest.importorskip("pyspark")
    from tailguard.agent.adapters.spark import runner_listen_address

    with pytest.raises(ValueError, match=r"spark\.driver\.host is not set"):
        runner_listen_address({"spark.driver.host": ""}, False)


DRIVER = {
    "host": "d",
    "python": "/venv/bin/python",
    "python_version": "3.11.7",
    "tailguard": "0.1.0+abc",
    "tailguard_path": "/venv/tailguard",
}


def report(**changes: str) -> dict[str, str]:
    return {**DRIVER, "host": "10.147.0.21", **changes}


def test_matching_executors_pass_the_check() -> None:
    assert incompatibilities(DRIVER, [report(), report(host="10.147.0.22")]) == []
    # Only the minor Python version has to match (pickles do not change within it).
    assert incompatibilities(DRIVER, [report(python_version="3.11.2")]) == []


def test_an_executor_without_tailguard_is_named_with_its_interpreter_and_the_error() -> None:
    missing = {
        "host": "10.147.0.21",
        "python": "/usr/bin/python3",
        "python_version": "3.11.2",
        "error": "ModuleNotFoundError: No module named 'tailguard'",
    }
    (problem,) = incompatibilities(DRIVER, [missing, missing])  # one line per distinct problem
    assert problem == (
        "executor 10.147.0.21 (python /usr/bin/python3 3.11.2) cannot import tailguard: "
        "ModuleNotFoundError: No module named 'tailguard'"
    )
    message = environment.failure_message([problem])
    assert "spark.archives" in message and "docs/deploy.md" in message


def test_another_build_or_python_is_reported() -> None:
    problems = incompatibilities(
        DRIVER, [report(tailguard="0.1.0+def", tailguard_path="/env/tailguard")]
    )
    assert problems == [
        "executor 10.147.0.21 (python /venv/bin/python 3.11.7) runs tailguard 0.1.0+def from "
        "/env/tailguard, the driver 0.1.0+abc"
    ]
    (python,) = incompatibilities(DRIVER, [report(python_version="3.12.1")])
    assert "Python 3.12.1, the driver 3.11.7" in python


def test_this_python_reports_this_tailguard_build() -> None:
    here = this_python()
    assert "error" not in here
    assert here["tailguard"] == tailguard_build()
    version, digest = tailguard_build().rsplit("+", 1)
    assert version and len(digest) == 12
    assert incompatibilities(here, [here]) == []


def test_the_build_changes_with_the_code(tmp_path: Path) -> None:
    # A copy of the package with one file changed is another build, with the same version.
    import tailguard

    copy = tmp_path / "tailguard"
    shutil.copytree(
        Path(tailguard.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__")
    )
    (copy / "model" / "ids.py").write_text((copy / "model" / "ids.py").read_text() + "\n# x\n")
    probe = (
        "from tailguard.agent.executor.environment import tailguard_build; print(tailguard_build())"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        env={"PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout.strip()
    assert out.split("+")[0] == tailguard_build().split("+")[0]
    assert out != tailguard_build()
