"""The local standalone cluster: distinct hosts, pinned attempts, throttled nodes (CPU and I/O
mode), the CLI.

The plugin's 2-worker cluster and its SparkSession (`tailguard_cluster`, `tailguard_spark`)
serve every Spark test; the CLI test drives its own 1-worker cluster in another work dir so
that `down` cannot break the others.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from psutil import STATUS_STOPPED as STOPPED

from tailguard.cluster import slowness
from tailguard.cluster.local import (
    ClusterError,
    LocalCluster,
    ThrottleWarning,
    cpu_throttle_caveat,
    find_java,
)
from tailguard.cluster.throttle import Throttler
from tailguard.processes import trees

try:
    find_java()
    JAVA_MISSING = ""
except ClusterError as exc:
    JAVA_MISSING = str(exc)

needs_java = pytest.mark.skipif(bool(JAVA_MISSING), reason=JAVA_MISSING or "java found")
spark = pytest.mark.spark

WORKERS = 2  # two hosts suffice (slow vs fast) and keep the JVM count low on 2 cores
# The plugin's tailguard_cluster fixture: this shape.
pytestmark = pytest.mark.tailguard_cluster(workers=WORKERS)


def poll(condition: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (result := condition()):
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)
    return result


def tree_states(root: int) -> dict[int, str | None]:
    return {pid: trees.status_of(pid) for pid in trees.descendants(root)}


# --------------------------------------------------------------------------- throttler alone
# A plain process tree stands in for a worker: fast, and it exercises re-discovery of
# descendants that appear after throttling started.

SPAWNS_LATE_CHILD = """
import subprocess, sys, time
time.sleep(0.3)
child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
while True:
    pass
"""


@pytest.fixture
def busy_tree() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", SPAWNS_LATE_CHILD], start_new_session=True)
    yield proc
    trees.terminate_trees([proc.pid], grace_s=2.0)


def test_throttler_pauses_late_children_and_resumes_all_on_stop(
    busy_tree: subprocess.Popen[bytes],
) -> None:
    throttler = Throttler(busy_tree.pid, factor=5, period_ms=50)
    seen_stopped: set[int] = set()
    runner = threading.Thread(target=throttler.run)
    runner.start()
    try:

        def child_seen_stopped() -> bool:
            states = tree_states(busy_tree.pid)
            seen_stopped.update(pid for pid, s in states.items() if s == STOPPED)
            return len(states) == 2 and any(p != busy_tree.pid for p in seen_stopped)

        poll(child_seen_stopped, 10.0, "the late child to be paused too")
    finally:
        throttler.stop()
        runner.join(5.0)
    assert not runner.is_alive()
    assert busy_tree.pid in seen_stopped
    states = tree_states(busy_tree.pid)
    assert len(states) == 2
    assert STOPPED not in states.values(), states


def test_detached_throttler_resumes_tree_on_sigterm(busy_tree: subprocess.Popen[bytes]) -> None:
    throttler = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tailguard.cluster.throttle",
            "--pid",
            str(busy_tree.pid),
            "--factor",
            "20",
            "--period-ms",
            "200",
        ],
    )
    try:
        poll(
            lambda: trees.status_of(busy_tree.pid) == STOPPED,
            10.0,
            "the tree to be paused",
        )
        throttler.send_signal(signal.SIGTERM)  # most likely while the tree is stopped
        assert throttler.wait(5.0) == 0
    finally:
        if throttler.poll() is None:
            throttler.kill()
    assert STOPPED not in tree_states(busy_tree.pid).values()


def test_throttler_with_duration_ends_by_itself(busy_tree: subprocess.Popen[bytes]) -> None:
    started = time.monotonic()
    Throttler(busy_tree.pid, factor=4, period_ms=50, duration_s=0.5).run()
    assert 0.45 <= time.monotonic() - started < 5.0
    assert STOPPED not in tree_states(busy_tree.pid).values()


def test_throttler_rejects_speed_up() -> None:
    with pytest.raises(ValueError, match="factor"):
        Throttler(os.getpid(), factor=0.5)


# --------------------------------------------------------------------------- I/O slowness alone


class FakeTime:
    """A clock that only the fake wait moves, and a factor that changes at a given time."""

    def __init__(self, changes: list[tuple[float, float]]) -> None:
        self.now = 0.0
        self.changes = changes  # (from time, factor), in time order
        self.waits: list[float] = []

    def clock(self) -> float:
        return self.now

    def wait(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds

    def factor(self) -> float:
        return [f for t, f in self.changes if t <= self.now + 1e-9][-1]


def test_io_work_takes_factor_times_longer() -> None:
    fake = FakeTime([(0.0, 5.0)])
    took = slowness.io_work(2.0, factor=fake.factor, wait=fake.wait, clock=fake.clock)
    assert took == pytest.approx(10.0)
    assert max(fake.waits) <= slowness.TICK_S + 1e-9  # the factor is re-read every tick
    healthy = FakeTime([(0.0, 1.0)])
    assert slowness.io_work(
        2.0, factor=healthy.factor, wait=healthy.wait, clock=healthy.clock
    ) == pytest.approx(2.0)


def test_io_work_applies_a_factor_change_to_the_rest_of_the_task() -> None:
    # 1 s at 5x does 0.2 s of the work; the remaining 1.8 s then run at full speed.
    fake = FakeTime([(0.0, 5.0), (1.0, 1.0)])
    took = slowness.io_work(2.0, factor=fake.factor, wait=fake.wait, clock=fake.clock)
    assert took == pytest.approx(2.8)


def test_io_work_counts_late_wake_ups_as_progress() -> None:
    fake = FakeTime([(0.0, 1.0)])

    def oversleeps(seconds: float) -> None:
        fake.wait(seconds * 3)  # a busy machine wakes the task late

    took = slowness.io_work(1.0, factor=fake.factor, wait=oversleeps, clock=fake.clock)
    assert took <= 1.0 + 3 * slowness.TICK_S


def test_io_work_stops_when_the_wait_is_cancelled() -> None:
    class Cancelled(Exception):
        pass

    def cancelled(_seconds: float) -> None:
        raise Cancelled

    with pytest.raises(Cancelled):
        slowness.io_work(5.0, wait=cancelled)


def test_slowness_file_round_trip_expiry_and_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = slowness.slowness_file(tmp_path, "127.0.0.3")
    assert slowness.factor_of(path) == 1.0  # no file: healthy
    slowness.write(path, 5.0)
    assert slowness.factor_of(path) == 5.0
    monkeypatch.setenv(slowness.ENV_VAR, str(path))
    assert slowness.host_factor() == 5.0
    slow = slowness.write(path, 4.0, duration_s=30.0)
    assert slowness.factor_of(path, now=slow.until - 1) == 4.0  # type: ignore[operator]
    assert slowness.factor_of(path, now=slow.until) == 1.0  # expired: healthy again
    path.write_text("{not json")
    assert slowness.factor_of(path) == 1.0
    slowness.clear(path)
    assert not path.exists() and slowness.host_factor() == 1.0
    monkeypatch.delenv(slowness.ENV_VAR)
    assert slowness.host_factor() == 1.0
    with pytest.raises(ValueError, match="factor"):
        slowness.write(path, 0.5)


def test_slowness_that_starts_later(tmp_path: Path) -> None:
    """A node that turns slow mid-job: healthy before `since`, slow from it, for `duration_s`
    after it (not after the write)."""
    path = slowness.slowness_file(tmp_path, "127.0.0.3")
    slow = slowness.write(path, 5.0, after_s=6.0, now=1000.0)
    assert (slow.since, slow.until) == (1006.0, None)
    assert slowness.factor_of(path, now=1005.9) == 1.0
    assert slowness.factor_of(path, now=1006.0) == 5.0
    assert slowness.factor_of(path, now=99999.0) == 5.0
    slowness.write(path, 3.0, duration_s=4.0, after_s=6.0, now=1000.0)
    assert [slowness.factor_of(path, now=t) for t in (1005.0, 1006.0, 1009.9, 1010.0)] == [
        1.0,
        3.0,
        3.0,
        1.0,
    ]
    # A file written before `since` existed reads as slow from the start.
    path.write_text('{"factor": 2.0, "until": null}')
    assert slowness.factor_of(path, now=0.0) == 2.0
    for bad in ({"after_s": -1.0}, {"duration_s": -1.0}):
        with pytest.raises(ValueError, match="must be >= 0"):
            slowness.write(path, 2.0, **bad)  # type: ignore[arg-type]


def test_cpu_throttle_caveat_only_with_more_executors_than_cores() -> None:
    assert cpu_throttle_caveat(2, cpus=2) is None
    caveat = cpu_throttle_caveat(3, cpus=2)
    assert caveat is not None
    assert "3 executor cores over 2 CPUs" in caveat and "io" in caveat


# --------------------------------------------------------------------------- Spark cluster


@pytest.fixture
def sc(tailguard_spark: Any) -> Any:
    from pyspark import cloudpickle

    # Executors cannot import this test module, so ship its functions by value.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    return tailguard_spark.sparkContext


def executor_hosts(sc: Any) -> set[str]:
    return {e.host() for e in sc._jsc.sc().statusTracker().getExecutorInfos()}


def where_am_i(_payload: object) -> str:
    return os.environ["SPARK_LOCAL_IP"]


def timed_spin(n: int) -> float:
    """Fixed CPU-bound work; returns its wall time measured where it ran."""
    started = time.perf_counter()
    total = 0
    for i in range(n):
        total += i * i
    assert total >= 0
    return time.perf_counter() - started


@spark
@needs_java
def test_workers_have_distinct_loopback_hosts(tailguard_cluster: LocalCluster, sc: Any) -> None:
    assert tailguard_cluster.hosts() == [f"127.0.0.{i + 2}" for i in range(WORKERS)]
    assert set(tailguard_cluster.hosts()) <= executor_hosts(sc)
    state = json.loads((tailguard_cluster.work_dir / "cluster.json").read_text())
    assert [w["host"] for w in state["workers"]] == tailguard_cluster.hosts()
    assert state["master_url"] == tailguard_cluster.master_url
    # Work files must not land inside site-packages.
    assert all((tailguard_cluster.work_dir / f"worker-{i + 2}").is_dir() for i in range(WORKERS))


@spark
@needs_java
def test_pinned_tasks_run_on_the_requested_host(tailguard_cluster: LocalCluster, sc: Any) -> None:
    from tailguard.cluster.pinning import pinned_rdd

    for host in tailguard_cluster.hosts():
        for _ in range(3):
            assert pinned_rdd(sc, [(None, host)]).map(where_am_i).collect() == [host]
    # Several items at once: one partition each, each on its own host.
    items = [(i, h) for i, h in enumerate(reversed(tailguard_cluster.hosts() * 2))]
    rdd = pinned_rdd(sc, items)
    assert rdd.getNumPartitions() == len(items)
    ran = rdd.map(lambda p: (p, os.environ["SPARK_LOCAL_IP"])).collect()
    assert ran == items


@spark
@needs_java
def test_pinned_payload_arrives_as_the_original_object(
    tailguard_cluster: LocalCluster, sc: Any
) -> None:
    from tailguard.cluster.pinning import pinned_rdd

    payloads: list[object] = [b"\x00raw bytes\xff", {"vertex": "v1", "subtask": 3}, ("t", 1.5)]
    host = tailguard_cluster.hosts()[0]
    got = pinned_rdd(sc, [(p, host) for p in payloads]).map(lambda p: (type(p).__name__, p))
    assert got.collect() == [(type(p).__name__, p) for p in payloads]


@spark
@needs_java
def test_throttled_host_is_measurably_slower_until_unthrottled(
    tailguard_cluster: LocalCluster, sc: Any
) -> None:
    from tailguard.cluster.pinning import pinned_rdd

    slow, fast = tailguard_cluster.hosts()[0], tailguard_cluster.hosts()[1]
    work = 3_000_000  # ~0.15 s of pure Python on an idle core

    def slowdown() -> float:
        """Median ratio of the wall time of the same work on `slow` and on `fast`.

        The hosts take turns, so load from the rest of a shared machine hits both alike.
        """
        ratios = []
        for _ in range(3):
            on_slow, on_fast = (
                pinned_rdd(sc, [(work, host)]).map(timed_spin).collect()[0] for host in (slow, fast)
            )
            ratios.append(on_slow / on_fast)
        return statistics.median(ratios)

    before = slowdown()  # also warms both hosts' Python workers
    # Throttle only now: the executor is registered (see design §7).
    tailguard_cluster.throttle(slow, factor=5)
    try:
        throttled = slowdown()
        worker_pid = tailguard_cluster.worker(slow).pid
        assert len(trees.descendants(worker_pid)) >= 3  # worker, executor, python daemon/worker
    finally:
        tailguard_cluster.unthrottle(slow)
    restored = slowdown()
    print(f"slow/fast wall time: before {before:.2f}, x5 {throttled:.2f}, after {restored:.2f}")
    assert throttled > 2.0
    assert restored < throttled / 2
    # Unthrottle leaves nothing paused and forgets the throttler.
    assert STOPPED not in tree_states(tailguard_cluster.worker(slow).pid).values()
    assert (
        slow
        not in json.loads((tailguard_cluster.work_dir / "cluster.json").read_text())["throttles"]
    )


def io_slept(seconds: float) -> tuple[str, float, float]:
    """Healthy-host seconds of I/O work where it runs: (host, factor at the start, wall s)."""
    factor = slowness.host_factor()
    return os.environ["SPARK_LOCAL_IP"], factor, slowness.io_work(seconds)


@spark
@needs_java
def test_io_slowness_reaches_the_tasks_of_its_host_only(
    tailguard_cluster: LocalCluster, sc: Any
) -> None:
    from tailguard.cluster.pinning import pinned_rdd

    slow, fast = tailguard_cluster.hosts()[0], tailguard_cluster.hosts()[1]
    assert tailguard_cluster.without_io_slowness() == []

    def run(host: str, seconds: float) -> tuple[str, float, float]:
        result: tuple[str, float, float] = (
            pinned_rdd(sc, [(seconds, host)]).map(io_slept).collect()[0]
        )
        return result

    assert run(slow, 0.0)[1] == 1.0
    tailguard_cluster.throttle(slow, 5, mode="io")
    try:
        status = {w["host"]: w["throttle"] for w in tailguard_cluster.status()["workers"]}
        assert status[slow] is not None and status[slow]["mode"] == "io"
        assert status[fast] is None
        host, factor, took = run(slow, 0.3)
        assert (host, factor) == (slow, 5.0)
        assert 1.4 <= took < 3.0  # 0.3 s of work at 1/5 speed
        host, factor, took = run(fast, 0.3)
        assert (host, factor) == (fast, 1.0)
        assert took < 0.9
        # A slowness that expires mid-task: 0.5 s at 5x does 0.1 s of the work, the other
        # 0.5 s of it then runs at full speed (the task re-reads the factor every tick).
        tailguard_cluster.throttle(slow, 5, duration_s=0.5, mode="io")
        _host, factor, took = run(slow, 0.6)
        assert factor in (5.0, 1.0)  # 1.0 if the task started after the expiry (busy machine)
        assert took < 1.8  # 3 s if the change did not reach the running task
        tailguard_cluster.throttle(slow, 5, mode="io")
    finally:
        tailguard_cluster.unthrottle(slow)
    assert run(slow, 0.0)[1] == 1.0
    assert not slowness.slowness_file(tailguard_cluster.work_dir, slow).exists()


@spark
@needs_java
def test_cpu_throttle_warns_when_executors_outnumber_cores(
    tailguard_cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tailguard.cluster.local as local

    host = tailguard_cluster.hosts()[0]
    # As if the machine had one CPU for this cluster's two executors.
    monkeypatch.setattr(local, "cpu_throttle_caveat", lambda cores: cpu_throttle_caveat(cores, 1))
    try:
        with pytest.warns(ThrottleWarning, match="2 executor cores over 1 CPUs"):
            tailguard_cluster.throttle(host, 2, duration_s=0.2)
    finally:
        tailguard_cluster.unthrottle(host)


# --------------------------------------------------------------------------- the CLI


def tailguard(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tailguard.cli", "cluster", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@spark
@needs_java
def test_cli_up_status_throttle_down(tmp_path: Path) -> None:
    work = str(tmp_path / "cli-cluster")
    up = tailguard("--work-dir", work, "up", "--workers", "1")
    try:
        assert up.returncode == 0, up.stderr
        master_url = up.stdout.strip()
        assert master_url.startswith("spark://127.0.0.1:")
        assert "starting worker 127.0.0.2" in up.stderr
        state = json.loads((tmp_path / "cli-cluster" / "cluster.json").read_text())
        worker_pid = state["workers"][0]["pid"]

        again = tailguard("--work-dir", work, "up", "--workers", "1")
        assert again.returncode == 0, again.stderr
        assert again.stdout.strip() == master_url
        assert "reusing" in again.stderr
        other_shape = tailguard("--work-dir", work, "up", "--workers", "2")
        assert other_shape.returncode == 1
        assert "another shape" in other_shape.stderr

        status = tailguard("--work-dir", work, "status", "--json")
        assert status.returncode == 0, status.stderr
        report = json.loads(status.stdout)
        assert report["master_url"] == master_url
        assert [(w["host"], w["registered"]) for w in report["workers"]] == [("127.0.0.2", True)]

        throttle = tailguard(
            "--work-dir", work, "throttle", "127.0.0.2", "--factor", "5", "--for", "30s"
        )
        assert throttle.returncode == 0, throttle.stderr
        human = tailguard("--work-dir", work, "status")
        assert "throttled x5" in human.stdout
        # --work-dir after the verb, as with `tailguard broker` and `tailguard services`.
        after = tailguard("status", "--work-dir", work)
        assert after.returncode == 0 and "throttled x5" in after.stdout
        poll(
            lambda: trees.status_of(worker_pid) == STOPPED,
            10.0,
            "the worker to be paused",
        )
        off = tailguard("--work-dir", work, "throttle", "127.0.0.2", "--off")
        assert off.returncode == 0, off.stderr
        assert STOPPED not in tree_states(worker_pid).values()
        assert "throttled" not in tailguard("--work-dir", work, "status").stdout

        io = tailguard("--work-dir", work, "throttle", "127.0.0.2", "--factor", "5", "--mode", "io")
        assert io.returncode == 0, io.stderr
        assert "in io mode" in io.stderr
        assert "throttled x5 io" in tailguard("--work-dir", work, "status").stdout
        assert trees.status_of(worker_pid) != STOPPED  # io mode pauses nothing
        slow_file = tmp_path / "cli-cluster" / "slowness" / "127.0.0.2.json"
        assert slowness.factor_of(slow_file) == 5.0
        assert tailguard("--work-dir", work, "throttle", "127.0.0.2", "--off").returncode == 0
        assert not slow_file.exists()

        bad = tailguard("--work-dir", work, "throttle", "127.0.0.9", "--factor", "2")
        assert bad.returncode == 1
        assert "no worker 127.0.0.9" in bad.stderr
    finally:
        down = tailguard("--work-dir", work, "down")
    assert down.returncode == 0, down.stderr
    assert not (tmp_path / "cli-cluster" / "cluster.json").exists()
    assert not trees.is_alive(worker_pid)
    assert not trees.is_alive(state["master_pid"])
    gone = tailguard("--work-dir", work, "status")
    assert gone.returncode == 1
    assert "no cluster state file" in gone.stderr
    again = tailguard("down", "--work-dir", work)  # nothing to stop is no error
    assert again.returncode == 0 and "no cluster running" in again.stderr
