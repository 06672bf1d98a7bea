"""The local stack the demo, the end-to-end tests and the benchmarks run on: the embedded broker,
the 3-worker Spark cluster and the services — each a context manager that stops on exit only
what it started itself (what was already running is left running).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

Report = Callable[[str], None]


def _quiet(_message: str) -> None:
    pass


@contextlib.contextmanager
def broker(work_dir: Path, say: Report = _quiet) -> Iterator[str]:
    from tailguard.broker.embedded import EmbeddedBroker

    # Apache Kafka's broker: its first start resolves its jars and formats its storage, and
    # every start waits for it to answer; `say` shows each step.
    embedded = EmbeddedBroker(work_dir, report=say)
    bootstrap = embedded.start()
    say(f"broker at {bootstrap} ({'started' if embedded.started_here else 'already running'})")
    try:
        yield bootstrap
    finally:
        if embedded.started_here:
            embedded.stop()
            say("broker stopped")


@contextlib.contextmanager
def cluster(work_dir: Path, workers: int = 3, say: Report = _quiet) -> Iterator[Any]:
    from tailguard.cluster.local import ClusterError, LocalCluster

    started = True
    with contextlib.suppress(ClusterError):
        started = not LocalCluster.attach(work_dir / "cluster").processes_alive()
    local = LocalCluster(workers, 1, "1g", work_dir / "cluster", progress=say)
    local.start()
    say(f"Spark cluster at {local.master_url}, workers {', '.join(local.hosts())}")
    try:
        yield local
    finally:
        if started:
            local.stop()
            say("cluster stopped")


@contextlib.contextmanager
def services(
    work_dir: Path, config: Path | None, enabled: bool = True, say: Report = _quiet
) -> Iterator[None]:
    if not enabled:
        say("services: not started (--no-services): every decision is a local fallback")
        yield
        return
    from tailguard.shell import supervisor

    before = set(supervisor.running(work_dir))
    supervisor.start(
        work_dir, config=str(config) if config else None, report=lambda m: say(f"service {m}")
    )
    try:
        yield
    finally:
        started = [n for n in supervisor.running(work_dir) if n not in before]
        supervisor.stop(work_dir, started, report=lambda m: say(f"service {m}"))


def await_executors(spark: Any, hosts: list[str], timeout_s: float = 120.0) -> None:
    from tailguard.agent.adapters.spark import SparkRuntime

    runtime = SparkRuntime(spark)
    deadline = time.monotonic() + timeout_s
    try:
        while set(runtime.executors()) != set(hosts):
            if time.monotonic() > deadline:
                raise RuntimeError(f"executors registered: {sorted(runtime.executors())}")
            time.sleep(0.2)  # Spark's status tracker has no registration callback
    finally:
        runtime.close()
