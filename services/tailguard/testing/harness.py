"""The resources behind the pytest plugin's fixtures, shared by a whole pytest session.

Starting them is what costs (measured on this 2-core machine, idle): Apache Kafka's broker
~10 s (the mock ~1 s), a local cluster ~10-15 s, a Spark driver ~5 s (plus the executors'
registration on a cluster), the five services ~10 s. So one `Harness` per pytest session keeps
**one of each at a time** and hands the same one to every test that asks for the same thing:

- the broker: one for the session;
- the cluster: one shape at a time (workers, cores, memory); a test that asks for another shape
  replaces it, and one that finds it broken (a test killed a worker) gets a fresh one;
- the Spark session: one at a time, because PySpark allows one SparkContext per process; asking
  for another master or other settings stops the current one first;
- the services: one set at a time, keyed by their settings;
- slow hosts: applied for as long as a test (or a module) needs them, then lifted.

Everything is stopped at the end by the process ids this harness started; what it found
already running (a cluster or broker under a configured work dir, `tailguard cluster up`) is
reused and left running. Each process is also written down in the session's ledger
(tailguard.testing.leftovers) the moment it starts, so that a run killed before its teardown
leaves nothing running past the next session's start.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import signal
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from tailguard.testing.markers import (
    CLUSTER_MARKER,
    SERVICES_MARKER,
    SPARK_MARKER,
    ClusterRequest,
    ClusterShape,
    Defaults,
    HarnessUsageError,
    ServicesRequest,
    cluster_request,
    services_request,
    spark_conf,
)

if TYPE_CHECKING:
    from tailguard.testing.leftovers import Ledger

SPARK_APP_NAME = "tailguard-pytest"
# Spark's own INFO/WARN lines drown a test's output; errors still show.
SPARK_LOG_LEVEL = "ERROR"


class HarnessError(RuntimeError):
    """A resource could not be provided; the message says which and why."""


class JavaMissing(HarnessError):
    """No JDK for Spark (the plugin skips the test with this reason instead)."""


class MarkedNode(Protocol):
    """What the `*_of(node)` methods read: a pytest node (test, class or module)."""

    def get_closest_marker(self, name: str) -> Any: ...


@dataclass(frozen=True)
class Broker:
    """The embedded broker of the session."""

    bootstrap: str
    work_dir: Path
    pid: int
    started_here: bool

    def settings(self) -> dict[str, str]:
        return {"bootstrap.servers": self.bootstrap}


@dataclass
class Services:
    """The five services (or the requested ones) as separate processes on the session's broker.

    `settings` is what they run with (their settings file): `run_job(..., services=...)` runs
    the job with the same policy settings, so that replay reproduces their decisions.
    """

    request: ServicesRequest
    work_dir: Path
    config: Path
    settings: Any  # tailguard.model.config.Settings
    # The services this harness launched: the only ones it stops.
    started: set[str] = field(default_factory=set)
    # Told (what, pid) of each process launched, as soon as it is (the session's ledger).
    on_launch: Callable[[str, int], None] | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return self.request.names

    def running(self) -> dict[str, Any]:
        """name -> `RunningService` (pid, metrics URL) of those running now."""
        from tailguard.shell import supervisor

        return supervisor.running(self.work_dir)

    def start(self, names: Sequence[str] | None = None, instances: int = 1) -> dict[str, Any]:
        """Start those of `names` (default: all of this set) that are not running, `instances`
        of each that scales out (`detector`, `detector-2`...: `tailguard services up
        --instances`); returns every instance of them, by instance name, once all are ready."""
        from tailguard import stack

        wanted = list(names or self.names)
        part = stack.ServicesPart(self.work_dir)
        try:
            stack.start_services(
                self.work_dir,
                wanted,
                self.config,
                on_launch=self.on_launch,
                part=part,
                instances=instances,
            )
        finally:
            self.started |= set(part.started)
        return {n: s for n, s in self.running().items() if s.service in wanted}

    def kill(self, name: str, timeout_s: float = 10.0) -> int:
        """SIGKILL one service (as a crash would) and wait until it is gone; its pid."""
        service = self.running().get(name)
        if service is None:
            raise HarnessError(f"service {name!r} is not running (running: {list(self.running())})")
        os.kill(service.pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout_s
        while name in self.running():
            if time.monotonic() > deadline:
                raise HarnessError(f"service {name} (pid {service.pid}) still alive after SIGKILL")
            time.sleep(0.05)  # the pid has no exit event to wait on: it is not our child
        return int(service.pid)

    def restart(self, name: str) -> Any:
        """Stop `name` (if running) and start it again; its new `RunningService`."""
        from tailguard.shell import supervisor

        supervisor.stop(self.work_dir, [name], report=_quiet)
        return self.start([name])[name]

    def stop(self) -> None:
        from tailguard.shell import supervisor

        supervisor.stop(self.work_dir, sorted(self.started), report=_quiet)
        self.started.clear()


@dataclass(frozen=True)
class Cost:
    """One start of an expensive resource, for the session's summary."""

    what: str
    seconds: float


@dataclass
class _ClusterSlot:
    shape: ClusterShape
    local: Any  # LocalCluster
    started_here: bool
    master_url: str


@dataclass
class _SparkSlot:
    key: tuple[str, tuple[tuple[str, str], ...]]
    session: Any  # SparkSession


def _quiet(_message: str) -> None:
    pass


def _raise_java_missing(reason: str) -> NoReturn:
    raise JavaMissing(reason)


def _marker(node: MarkedNode, name: str) -> tuple[tuple[Any, ...], dict[str, Any]]:
    found = node.get_closest_marker(name)
    return (tuple(found.args), dict(found.kwargs)) if found is not None else ((), {})


def toml_settings(values: Mapping[str, str]) -> str:
    """A settings file's text: JSON strings are valid TOML basic strings (same escapes)."""
    return "".join(f"{json.dumps(k)} = {json.dumps(v)}\n" for k, v in sorted(values.items()))


class Harness:
    """One broker, one cluster, one Spark session and one set of services at a time."""

    def __init__(
        self,
        root: Path,
        defaults: Defaults | None = None,
        java_missing: Callable[[str], NoReturn] = _raise_java_missing,
        ledger: Ledger | None = None,
    ) -> None:
        """`root` holds the state of what the harness starts; `defaults` are the options'
        values (`tailguard_workers`, ...); `java_missing` is called with the reason when Spark
        is asked for without a JDK (the plugin skips the test); `ledger` is where each started
        process is written down (the plugin's: one per pytest session)."""
        self.root = Path(root).resolve()
        self.ledger = ledger
        self.defaults = defaults or Defaults()
        self._java_missing = java_missing
        self.costs: list[Cost] = []
        self._broker: Broker | None = None
        self._cluster: _ClusterSlot | None = None
        self._spark: _SparkSlot | None = None
        self._services: Services | None = None
        # host -> (factor, mode) currently applied by this harness.
        self._slow: dict[str, tuple[float, str]] = {}

    def _record(self, pid: int, what: str) -> None:
        if self.ledger is not None:
            self.ledger.record(pid, what)

    def _launched(self, what: str, pid: int) -> None:
        """What the stack's parts tell as each process is launched (`stack.OnLaunch`)."""
        self._record(pid, what)

    def _timed(self, what: str, start: Callable[[], Any]) -> Any:
        began = time.monotonic()
        value = start()
        self.costs.append(Cost(what, time.monotonic() - began))
        return value

    def _require_java(self) -> None:
        from tailguard.cluster.local import ClusterError, find_java

        try:
            find_java()
        except ClusterError as missing:
            self._java_missing(str(missing))

    # ------------------------------------------------------------------ as markers say

    def cluster_of(self, node: MarkedNode) -> Any:
        """The cluster `@pytest.mark.tailguard_cluster` on `node` (or the defaults) asks for."""
        return self.cluster_for(self._cluster_request(node), self._spark_conf(node))

    def spark_of(self, node: MarkedNode) -> Any:
        """The Spark session on that cluster, with `@pytest.mark.tailguard_spark`'s settings."""
        return self.spark(self.cluster_of(node), self._spark_conf(node))

    def local_spark_of(self, node: MarkedNode) -> Any:
        """A Spark session on the local master (`tailguard_local_master`, local[2])."""
        return self.spark(None, self._spark_conf(node))

    def services_of(self, node: MarkedNode) -> Services:
        """The services `@pytest.mark.tailguard_services` on `node` asks for."""
        return self.services(services_request(*_marker(node, SERVICES_MARKER)))

    def slow_hosts_of(
        self, node: MarkedNode
    ) -> contextlib.AbstractContextManager[dict[str, float]]:
        """A block during which the marker's slow hosts are slow."""
        request = self._cluster_request(node)
        local = self.cluster_for(request, self._spark_conf(node))
        return self.slowed(local, request.slow, request.slow_mode)

    def _cluster_request(self, node: MarkedNode) -> ClusterRequest:
        return cluster_request(*_marker(node, CLUSTER_MARKER), self.defaults)

    @staticmethod
    def _spark_conf(node: MarkedNode) -> tuple[tuple[str, str], ...]:
        return spark_conf(*_marker(node, SPARK_MARKER))

    # ------------------------------------------------------------------ broker

    def broker(self) -> Broker:
        if self._broker is None:
            from tailguard import stack
            from tailguard.broker.embedded import broker_name

            mock = self.defaults.broker == "mock"
            what = f"embedded broker ({broker_name(mock)})"
            try:
                part = self._timed(
                    what,
                    lambda: stack.start_broker(
                        self.root / "broker", mock=mock, on_launch=self._launched
                    ),
                )
            except stack.StackError as err:
                raise HarnessError(str(err)) from None
            if not part.started_here:
                self.costs.pop()  # reused: nothing was started
            self._broker = Broker(part.bootstrap, part.work_dir, part.pid, part.started_here)
        return self._broker

    # ------------------------------------------------------------------ cluster

    def cluster(self, shape: ClusterShape) -> Any:
        """A running local cluster of `shape` (a `LocalCluster`), reused while healthy."""
        slot = self._cluster
        if slot is not None and slot.shape == shape and slot.local.processes_alive():
            return slot.local
        self._drop_cluster()
        self._require_java()
        from tailguard import stack

        spec = stack.ClusterSpec(
            shape.workers, shape.cores, shape.memory, cpu_budgets=shape.cpu_budgets
        )
        try:
            part = self._timed(
                f"cluster ({shape.describe()})",
                lambda: stack.start_cluster(
                    self.root / "cluster",
                    spec,
                    on_launch=self._launched,
                    before_launch=self.ledger.record_cluster if self.ledger else None,
                ),
            )
        except stack.StackError as err:
            raise HarnessError(f"local cluster ({shape.describe()}): {err}") from None
        if not part.started_here:
            self.costs.pop()
        local = part.local
        self._cluster = _ClusterSlot(shape, local, part.started_here, local.master_url)
        return local

    def _drop_cluster(self) -> None:
        slot, self._cluster = self._cluster, None
        if slot is None:
            return
        if self._spark is not None and self._spark.key[0] == slot.master_url:
            self.release_spark()
        self._slow.clear()
        if slot.started_here:
            slot.local.stop()

    # ------------------------------------------------------------------ Spark

    def spark(self, target: Any = None, conf: Sequence[tuple[str, str]] = ()) -> Any:
        """The Spark session on `target` (a `LocalCluster`, a master URL, or None for the local
        master), with the executors of a cluster registered. One session at a time."""
        hosts: list[str] = []
        if target is None:
            master = self.defaults.local_master
        elif isinstance(target, str):
            master = target
        else:
            master, hosts = target.master_url, target.hosts()
        key = (master, tuple(conf))
        slot = self._spark
        if slot is not None and slot.key == key and _session_alive(slot.session):
            return slot.session
        self.release_spark()
        self._require_java()
        from pyspark import SparkContext

        active = SparkContext._active_spark_context
        if active is not None:
            raise HarnessError(
                f"a Spark session the tailguard harness did not start is active (master "
                f"{active.master}): PySpark allows one per process, so stop it (spark.stop()) "
                "before a test asks for tailguard_spark or tailguard_local_spark"
            )
        from tailguard import stack
        from tailguard.agent.adapters.spark import session_builder

        def start() -> Any:
            builder = session_builder(master, app_name=SPARK_APP_NAME)
            for name, value in conf:
                builder = builder.config(name, value)
            session = builder.getOrCreate()
            session.sparkContext.setLogLevel(SPARK_LOG_LEVEL)
            if hosts:
                stack.await_executors(session, hosts)
            return session

        what = "Spark session on " + ("the cluster" if hosts else master)
        session = self._timed(what, start)
        self._spark = _SparkSlot(key, session)
        return session

    def release_spark(self) -> None:
        """Stop the harness's Spark session, for a test that must build its own."""
        slot, self._spark = self._spark, None
        if slot is not None and _session_alive(slot.session):
            slot.session.stop()

    # ------------------------------------------------------------------ slow hosts

    def cluster_for(self, request: ClusterRequest, conf: Sequence[tuple[str, str]] = ()) -> Any:
        """The cluster of `request.shape`; with CPU-throttled hosts, also its Spark session
        (settings `conf`), because an executor that starts on a paused node registers late
        (design §7): the throttle goes on only after registration.

        A cpu-mode slow host on workers whose cores outnumber the CPUs gets a cluster with CPU
        budgets where cgroups allow (`cluster/cpu_budget.py`): pausing a node would hand its
        CPU to the others, cutting its quota does not. Without cgroups it is paused, with the
        `ThrottleWarning` that says what that is worth."""
        shape = request.shape
        if request.slow and request.slow_mode == "cpu" and _budgets_make_cpu_slowness_real(shape):
            shape = dataclasses.replace(shape, cpu_budgets=True)
        local = self.cluster(shape)
        if request.slow and request.slow_mode == "cpu":
            self.spark(local, conf)
        return local

    @contextlib.contextmanager
    def slowed(
        self, local: Any, slow: Mapping[str, float], mode: str = "cpu"
    ) -> Iterator[dict[str, float]]:
        """Slow the given hosts of `local` down for the duration of the block; what an outer
        block already applied stays as it was."""
        unknown = sorted(set(slow) - set(local.hosts()))
        if unknown:
            raise HarnessUsageError(
                f"slow hosts {unknown} are not workers of the cluster ({', '.join(local.hosts())})"
            )
        previous: dict[str, tuple[float, str] | None] = {}
        try:
            for host, factor in slow.items():
                if self._slow.get(host) == (factor, mode):
                    continue
                previous[host] = self._slow.get(host)
                local.throttle(host, factor, mode=mode)
                self._slow[host] = (factor, mode)
            yield dict(slow)
        finally:
            still_here = self._cluster is not None and self._cluster.local is local
            for host, before in previous.items():
                if not still_here:
                    continue  # replaced or stopped with its throttles
                if before is None:
                    local.unthrottle(host)
                    self._slow.pop(host, None)
                else:
                    local.throttle(host, before[0], mode=before[1])
                    self._slow[host] = before

    # ------------------------------------------------------------------ services

    def services(self, request: ServicesRequest) -> Services:
        """The services of `request`, running on the session's broker (started if needed, and
        any that a test killed started again)."""
        current = self._services
        if current is not None and current.request != request:
            current.stop()
            self._services = current = None
        if current is None:
            from tailguard.settings_file import load_settings

            broker = self.broker()
            digest = hashlib.sha256(repr(request).encode()).hexdigest()[:10]
            work = self.root / f"services-{digest}"
            work.mkdir(parents=True, exist_ok=True)
            config = work / "tailguard.toml"
            values = {
                **dict(request.settings),
                **broker.settings(),
                "tailguard.work-dir": str(work),
            }
            config.write_text(toml_settings(values))
            current = Services(
                request, work, config, load_settings(config, environ={}), on_launch=self._launched
            )
            self._services = current
            self._timed(f"services ({', '.join(request.names)})", current.start)
            if not current.started:
                self.costs.pop()  # all of them were running already: nothing was started
        else:
            current.start()
        return current

    # ------------------------------------------------------------------ the end

    def close(self) -> None:
        """Stop everything this harness started, newest first."""
        errors: list[str] = []
        steps: list[tuple[str, Callable[[], None]]] = [
            ("Spark session", self.release_spark),
            ("services", self._services.stop if self._services else lambda: None),
            ("cluster", self._drop_cluster),
            ("broker", self._stop_broker),
        ]
        for what, step in steps:
            try:
                step()
            except Exception as err:  # keep stopping the rest
                errors.append(f"{what}: {err}")
        self._services = None
        if self.ledger is not None:
            # What the steps above missed: a failed stop, or a process launched while a
            # signal interrupted its start (so never handed to a step).
            self.ledger.close()
        if errors:
            raise HarnessError("could not stop everything: " + "; ".join(errors))

    def _stop_broker(self) -> None:
        broker, self._broker = self._broker, None
        if broker is None or not broker.started_here:
            return
        from tailguard import stack

        # Only if it is still the one this harness started.
        stack.BrokerPart(broker.bootstrap, broker.pid, broker.work_dir, True).stop()


def _session_alive(session: Any) -> bool:
    return getattr(session.sparkContext, "_jsc", None) is not None


def _budgets_make_cpu_slowness_real(shape: ClusterShape) -> bool:
    """Whether a cpu-mode slow host needs CPU budgets to lose capacity (more executor cores than
    CPUs) and this machine can give them."""
    from tailguard.cluster import cpu_budget
    from tailguard.cluster.local import cpu_throttle_caveat

    oversubscribed = cpu_throttle_caveat(shape.workers * shape.cores) is not None
    return oversubscribed and cpu_budget.hierarchy() is not None
