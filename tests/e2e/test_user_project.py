"""The sample user project (examples/user_project) passes under pytest: a copy of it outside
this tree, with its own pyproject.toml, run by `python -m pytest` in a subprocess that gets the
fixtures from the installed tailguard's plugin (pytest11 entry point), nothing from this suite.

The default suite runs its local[2] test (one Spark driver); the whole project (a 3-worker
cluster with a slow host, the five services) is marked slow.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tailguard.testing import Harness

PROJECT = Path(__file__).resolve().parents[2] / "examples" / "user_project"
# What the sample may import of tailguard: the public API and the test helpers.
PUBLIC = {"tailguard", "tailguard.testing"}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    copy = tmp_path / "user_project"
    shutil.copytree(PROJECT, copy, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    return copy


def run_pytest(project: Path, *args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    # Nothing of this suite's setup leaks in: no PYTHONPATH to this tree, no pytest options.
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTEST_ADDOPTS"}}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def explain(done: subprocess.CompletedProcess[str]) -> str:
    return f"exit {done.returncode}\n{done.stdout[-6000:]}\n{done.stderr[-3000:]}"


def test_the_sample_uses_only_the_public_api_and_the_plugin() -> None:
    imported: set[str] = set()
    for path in PROJECT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
    ours = {name for name in imported if name.split(".")[0] == "tailguard"}
    assert ours and ours <= PUBLIC, ours - PUBLIC


@pytest.mark.spark
def test_the_sample_projects_local_test_passes(project: Path) -> None:
    done = run_pytest(project, "-m", "not slow", timeout_s=600)
    assert done.returncode == 0, explain(done)
    assert "1 passed, 1 deselected" in done.stdout, explain(done)
    # The fixtures came from the installed plugin (its summary of what it started).
    assert "tailguard harness: what it started" in done.stdout, explain(done)
    assert "Spark session on local[2]" in done.stdout


@pytest.mark.long
@pytest.mark.spark
@pytest.mark.slow
def test_the_whole_sample_project_passes(project: Path, tailguard_harness: Harness) -> None:
    # The project starts a cluster and services of its own: this process's Spark session
    # would only hold memory and CPU meanwhile.
    tailguard_harness.release_spark()
    done = run_pytest(project, timeout_s=1200)
    assert done.returncode == 0, explain(done)
    assert "2 passed" in done.stdout, explain(done)
    assert "services (detector, speculator, blocklist, decider, failover)" in done.stdout
