"""Packaging, the real thing: `pip install '.[services]'` into a fresh venv.

Issue 10's acceptance: the install pulls no pyspark, and `tailguard services up` works from it.
The venv's commands run with only the venv on PATH and no JAVA_HOME, so the services also prove
they need no JDK. Minutes (a wheel build and an install): `make test-packaging`, not the default
run; tests/unit/test_packaging.py holds the fast checks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import venv
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.packaging, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SPARK_ONLY = {"pyspark", "py4j", "numpy", "pandas", "tqdm"}
SERVICES = ("detector", "speculator", "blocklist", "decider", "failover")


def _run(
    argv: list[str], env: dict[str, str], cwd: Path, timeout: float = 180.0
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def services_venv(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Path, dict[str, str]]]:
    """A fresh venv with `tailguard[services]` installed from a copy of this source tree (the
    build writes build/ and *.egg-info next to its sources: not in the shared tree)."""
    base = tmp_path_factory.mktemp("packaging")
    source = base / "src"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git",
            ".venv*",
            "work",
            "build",
            "dist",
            "*.egg-info",
            "__pycache__",
            ".*cache*",
            ".hypothesis",
        ),
    )
    env_dir = base / "venv"
    venv.create(env_dir, with_pip=True)
    bin_dir = env_dir / "bin"
    env = {
        k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "VIRTUAL_ENV", "PYTHONPATH")
    }
    env["PATH"] = str(bin_dir)  # no java, no other Python tools: only what the install brought
    install = _run(
        [str(bin_dir / "python"), "-m", "pip", "install", "--quiet", f"{source}[services]"],
        env,
        base,
        timeout=900.0,
    )
    assert install.returncode == 0, install.stderr[-4000:]
    yield bin_dir, env


def test_services_install_has_no_pyspark(services_venv: tuple[Path, dict[str, str]]) -> None:
    bin_dir, env = services_venv
    listed = _run([str(bin_dir / "python"), "-m", "pip", "list", "--format", "json"], env, bin_dir)
    assert listed.returncode == 0, listed.stderr
    names = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert {"tailguard", "faust-streaming", "confluent-kafka"} <= names
    assert not names & SPARK_ONLY, sorted(names & SPARK_ONLY)
    assert shutil.which("java", path=env["PATH"]) is None


def test_services_up_from_the_services_install(
    services_venv: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """A broker and the five services start from that venv and report healthy. The broker is the
    mock: Apache Kafka's needs a JDK, which a services-only host does not have (in production the
    services reach the deployment's Kafka cluster)."""
    bin_dir, env = services_venv
    tailguard = str(bin_dir / "tailguard")
    work = tmp_path / "work"
    broker = _run([tailguard, "broker", "up", "--mock", "--work-dir", str(work)], env, tmp_path)
    assert broker.returncode == 0, broker.stdout + broker.stderr
    try:
        # `up` returns once every service answers its health check (or fails naming the one
        # that did not); `status` then asks each one again.
        up = _run([tailguard, "services", "up", "--work-dir", str(work)], env, tmp_path)
        assert up.returncode == 0, up.stdout + up.stderr + _logs(work)
        status = _run([tailguard, "services", "status", "--work-dir", str(work)], env, tmp_path)
        assert status.returncode == 0, status.stdout + status.stderr
        for name in SERVICES:
            assert f"{name}: ready" in status.stdout, status.stdout + _logs(work)
        # The services are that venv's interpreter, not some other tailguard on the machine.
        for name in SERVICES:
            pid = json.loads((work / "services" / f"{name}.json").read_text())["pid"]
            command = Path(f"/proc/{pid}/cmdline").read_text().split("\0")
            assert command[0] == str(bin_dir / "python"), command
    finally:
        _run([tailguard, "services", "down", "--work-dir", str(work)], env, tmp_path)
        _run([tailguard, "broker", "--stop", "--work-dir", str(work)], env, tmp_path)


def test_agent_command_names_the_spark_extra(
    services_venv: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    bin_dir, env = services_venv
    job = tmp_path / "job.py"
    job.write_text("def main(params):\n    raise AssertionError('never reached')\n")
    result = _run([str(bin_dir / "tailguard"), "run", str(job)], env, tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "pip install 'tailguard[spark]'" in result.stderr
    assert "Traceback" not in result.stderr


def _logs(work: Path) -> str:
    logs = sorted((work / "services").glob("*.log")) if (work / "services").exists() else []
    return "".join(f"\n--- {p.name}\n{p.read_text()[-2000:]}" for p in logs)
