"""`stack.start_cluster` takes whether it started the cluster from the cluster's own start, on
stand-in daemons (sleeping Pythons) and a master that reports every worker ALIVE: no JVM."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tailguard import stack
from tailguard.cluster import local
from tailguard.cluster.local import LocalCluster
from tailguard.processes.supervised import alive, launch

SPEC = stack.ClusterSpec(workers=1, cores=1, memory="512m")


@pytest.fixture
def stand_ins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The pids of the stand-in daemons launched; any still running at the end is killed."""
    pids: list[int] = []

    def spawn(argv: list[str], env: dict[str, str], log: Path) -> Any:
        proc = launch([sys.executable, "-c", "import time; time.sleep(120)"], log, env=env)
        pids.append(proc.pid)
        return proc

    def status(web_ui: str, timeout_s: float = 2.0) -> dict[str, Any]:
        return {"workers": [{"host": local.worker_host(0), "state": "ALIVE"}]}

    monkeypatch.setattr(local, "find_java", lambda: sys.executable)
    monkeypatch.setattr(local, "spark_home", lambda: tmp_path)
    monkeypatch.setattr(LocalCluster, "_spawn", staticmethod(spawn))
    monkeypatch.setattr(local, "master_status", status)
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_cluster_that_stops_as_the_start_begins_is_started_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stand_ins: list[int]
) -> None:
    """The recorded cluster runs when the bring-up looks, and is stopped (another shell's
    `tailguard cluster down`) just before its start: the start launches a new one, which this
    bring-up started and must report, write down and stop."""
    directory = tmp_path / "cluster"
    LocalCluster(SPEC.workers, SPEC.cores, SPEC.memory, directory).start()
    first = list(stand_ins)
    start = LocalCluster.start

    def stopped_first(self: LocalCluster, *args: Any, **kwargs: Any) -> str:
        LocalCluster.attach(directory).stop(grace_s=1.0)
        return start(self, *args, **kwargs)

    monkeypatch.setattr(LocalCluster, "start", stopped_first)
    launched: list[int] = []
    written_down: list[Path] = []
    part = stack.start_cluster(
        directory,
        SPEC,
        on_launch=lambda _what, pid: launched.append(pid),
        before_launch=written_down.append,
    )
    assert not any(alive(pid) for pid in first)
    assert part.started_here
    assert sorted(launched) == sorted(set(stand_ins) - set(first))
    assert written_down == [directory.resolve()]
    part.stop()
    assert not any(alive(pid) for pid in stand_ins)


def test_a_running_cluster_is_reused_and_left_running(tmp_path: Path, stand_ins: list[int]) -> None:
    directory = tmp_path / "cluster"
    running = LocalCluster(SPEC.workers, SPEC.cores, SPEC.memory, directory)
    running.start()
    told: list[object] = []
    part = stack.start_cluster(
        directory, SPEC, on_launch=lambda *seen: told.append(seen), before_launch=told.append
    )
    assert not part.started_here and not told
    assert part.local.master_url == running.master_url
    assert all(alive(pid) for pid in stand_ins)
    running.stop(grace_s=1.0)
