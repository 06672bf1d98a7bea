"""The local stack, brought up one way: the embedded broker (which creates the declared topics),
then the services, then the Spark cluster, each part optional. The demo, the bench, the pytest
harness and `tailguard stack up|down|status` all bring theirs up here.

Each part is started through its supervisor (`broker/embedded.py`, `shell/supervisor.py`,
`cluster/local.py`, all on `tailguard.processes.supervised`), says its progress in lines (`say`),
and reuses what already runs under the work dir, which it then leaves running: `Stack.down` and
the context managers stop only what this bring-up started, newest first. A part that fails
raises `StackError`, which names the part and where its log is; the parts started before it are
stopped again.

    with stack.running(StackRequest(work_dir, cluster=ClusterSpec(3)), say=print) as up:
        up.bootstrap, up.cluster.master_url, up.services
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Report = Callable[[str], None]
# Told (what, pid) of each process a part launched, as soon as it is (the harness's ledger).
OnLaunch = Callable[[str, int], None]

BROKER = "broker"
SERVICES = "services"
CLUSTER = "cluster"


def _quiet(_message: str) -> None:
    pass


class StackError(RuntimeError):
    """A part of the stack could not be brought up: which, why, and where its log is."""

    def __init__(self, part: str, reason: str, log: Path) -> None:
        named = str(log) in reason  # the part's own error may name its log already
        super().__init__(f"{part}: {reason}" + ("" if named else f" (its log: {log})"))
        self.part = part
        self.log = log


@dataclass(frozen=True)
class ClusterSpec:
    """The local Spark cluster's shape and directory (default `<work_dir>/cluster`)."""

    workers: int = 3
    cores: int = 1
    memory: str = "1g"
    directory: Path | None = None
    # Each worker a cgroup CPU quota of its share of the machine (cluster/cpu_budget.py).
    cpu_budgets: bool = False


@dataclass(frozen=True)
class StackRequest:
    """Which parts to bring up under `work_dir`; each is optional."""

    work_dir: Path
    broker: bool = True
    mock_broker: bool = False
    # The services to start (all of the table's by default; () for none) and their settings.
    services: Sequence[str] | None = None
    config: Path | None = None
    cluster: ClusterSpec | None = None


@dataclass
class BrokerPart:
    bootstrap: str
    pid: int
    work_dir: Path
    started_here: bool

    def stop(self) -> None:
        from tailguard.broker.embedded import EmbeddedBroker

        embedded = EmbeddedBroker(self.work_dir)
        state = embedded.status()
        if state is not None and state.pid == self.pid:  # still the one started here
            embedded.stop()


@dataclass
class ServicesPart:
    work_dir: Path
    # The services this bring-up launched: the only ones it stops.
    started: list[str] = field(default_factory=list)

    def running(self) -> dict[str, Any]:
        """name -> `RunningService` of those running now."""
        from tailguard.shell import supervisor

        return supervisor.running(self.work_dir)

    def stop(self, names: Sequence[str] | None = None, say: Report = _quiet) -> None:
        from tailguard.shell import supervisor

        stopping = list(self.started if names is None else names)
        supervisor.stop(self.work_dir, stopping, report=lambda m: say(f"service {m}"))
        self.started = [n for n in self.started if n not in stopping]


@dataclass
class ClusterPart:
    local: Any  # LocalCluster
    started_here: bool

    def stop(self) -> None:
        self.local.stop()


def start_broker(
    work_dir: Path, *, mock: bool = False, say: Report = _quiet, on_launch: OnLaunch | None = None
) -> BrokerPart:
    """The embedded broker under `work_dir` (Apache Kafka, or librdkafka's mock), started or
    found running; Kafka's start creates the declared topics."""
    from tailguard.broker.embedded import LOG_FILE, EmbeddedBroker
    from tailguard.kafka.bootstrap import BrokerError

    # Apache Kafka's first start resolves its jars and formats its storage, and every start
    # waits for it to answer and lead the topics' partitions; `say` shows each step.
    embedded = EmbeddedBroker(work_dir, mock=mock, report=say)
    try:
        bootstrap = embedded.start()
    except BrokerError as err:
        raise StackError(BROKER, str(err), embedded.work_dir / LOG_FILE) from None
    state = embedded.status()
    if state is None:
        raise StackError(BROKER, "it died at once", embedded.work_dir / LOG_FILE)
    if embedded.started_here and on_launch is not None:
        on_launch(f"embedded broker ({embedded.name}) {bootstrap}", state.pid)
    say(f"broker at {bootstrap} ({'started' if embedded.started_here else 'already running'})")
    return BrokerPart(bootstrap, state.pid, embedded.work_dir, embedded.started_here)


def start_services(
    work_dir: Path,
    names: Sequence[str] | None = None,
    config: Path | None = None,
    *,
    say: Report = _quiet,
    on_launch: OnLaunch | None = None,
    part: ServicesPart | None = None,
    instances: int = 1,
) -> ServicesPart:
    """The named services (default: all) on the broker `config` names, those not running
    started (`instances` of each that scales out: `tailguard services up --instances`); returns
    when all are ready. With `part`, what is started is added to it."""
    from tailguard.shell import supervisor
    from tailguard.system.services import SERVICE_NAMES

    wanted = list(SERVICE_NAMES if names is None else names)
    part = part or ServicesPart(work_dir)
    before = set(supervisor.running(work_dir))
    try:
        supervisor.start(
            work_dir,
            wanted,
            config=str(config) if config else None,
            report=lambda m: say(f"service {m}"),
            on_launch=(lambda name, pid: on_launch(f"service {name}", pid)) if on_launch else None,
            count=instances,
        )
    except supervisor.ServiceError as err:
        raise StackError(SERVICES, str(err), supervisor.services_dir(work_dir)) from None
    finally:
        part.started += [n for n in supervisor.running(work_dir) if n not in before]
    return part


def start_cluster(
    directory: Path,
    spec: ClusterSpec,
    *,
    say: Report = _quiet,
    on_launch: OnLaunch | None = None,
    before_launch: Callable[[Path], None] | None = None,
) -> ClusterPart:
    """The local cluster of `spec` in `directory`, started or found running (a running one of
    another shape is an error); `before_launch(directory)` is called before anything starts
    (the harness writes the directory down then)."""
    from tailguard.cluster.local import ClusterError, LocalCluster

    local = LocalCluster(
        spec.workers,
        spec.cores,
        spec.memory,
        directory,
        progress=say,
        cpu_budgets=spec.cpu_budgets,
    )
    try:
        local.start(before_launch)
    except ClusterError as err:
        raise StackError(CLUSTER, str(err), local.work_dir / "logs") from None
    if local.started_here and on_launch is not None:
        state = local.state
        assert state is not None  # started
        on_launch(f"Spark master {state.master_url}", state.master_pid)
        for worker in state.workers:
            on_launch(f"Spark worker {worker.host}", worker.pid)
    say(f"Spark cluster at {local.master_url}, workers {', '.join(local.hosts())}")
    return ClusterPart(local, local.started_here)


@dataclass
class Stack:
    """What one bring-up has: each part asked for, and what it started. As a context manager,
    it is brought down on leaving the block."""

    request: StackRequest
    broker: BrokerPart | None = None
    services: ServicesPart | None = None
    cluster: ClusterPart | None = None
    say: Report = _quiet

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.down(self.say)

    @property
    def bootstrap(self) -> str | None:
        return self.broker.bootstrap if self.broker else None

    def down(self, say: Report = _quiet) -> None:
        """Stop what this bring-up started, newest first (the services before their broker);
        what it found running stays. Every part is tried; the first failure is raised after."""
        failed: list[BaseException] = []
        cluster, services, broker = self.cluster, self.services, self.broker
        steps: list[tuple[Callable[[], None], str]] = []
        if cluster is not None and cluster.started_here:
            steps.append((cluster.stop, "cluster stopped"))
        if services is not None and services.started:
            # A line per service, as each stops.
            steps.append((lambda: services.stop(say=say), ""))
        if broker is not None and broker.started_here:
            steps.append((broker.stop, "broker stopped"))
        for step, line in steps:
            try:
                step()
                if line:
                    say(line)
            except Exception as err:  # keep stopping the rest
                failed.append(err)
        if failed:
            raise failed[0]


def up(request: StackRequest, say: Report = _quiet, on_launch: OnLaunch | None = None) -> Stack:
    """Bring up the parts `request` asks for, in order: broker (and its topics), services,
    cluster. If one fails, what was started before it is stopped and `StackError` says which
    part failed and where its log is."""
    work_dir = request.work_dir
    stack = Stack(request, say=say)
    try:
        if request.broker:
            stack.broker = start_broker(
                work_dir, mock=request.mock_broker, say=say, on_launch=on_launch
            )
        if request.services is None or request.services:
            stack.services = ServicesPart(work_dir)
            start_services(
                work_dir,
                request.services,
                request.config,
                say=say,
                on_launch=on_launch,
                part=stack.services,
            )
        if request.cluster is not None:
            directory = request.cluster.directory or work_dir / "cluster"
            stack.cluster = start_cluster(directory, request.cluster, say=say, on_launch=on_launch)
    except BaseException:
        with contextlib.suppress(Exception):
            stack.down(say)
        raise
    return stack


@contextlib.contextmanager
def running(
    request: StackRequest, say: Report = _quiet, on_launch: OnLaunch | None = None
) -> Iterator[Stack]:
    """`up`, and on leaving the block `Stack.down`."""
    with up(request, say, on_launch) as stack:
        yield stack


@contextlib.contextmanager
def broker(work_dir: Path, say: Report = _quiet) -> Iterator[str]:
    """Only the broker: its bootstrap address."""
    with running(StackRequest(work_dir, services=()), say) as up_:
        assert up_.bootstrap is not None
        yield up_.bootstrap


@contextlib.contextmanager
def cluster(work_dir: Path, workers: int = 3, say: Report = _quiet) -> Iterator[Any]:
    """Only the cluster, in `<work_dir>/cluster`: the `LocalCluster`."""
    request = StackRequest(work_dir, broker=False, services=(), cluster=ClusterSpec(workers))
    with running(request, say) as up_:
        assert up_.cluster is not None
        yield up_.cluster.local


@contextlib.contextmanager
def services(
    work_dir: Path, config: Path | None, enabled: bool = True, say: Report = _quiet
) -> Iterator[None]:
    """Only the services, on the broker `config` names (none with `enabled` False)."""
    if not enabled:
        say("services: not started (--no-services): every decision is a local fallback")
        yield
        return
    with running(StackRequest(work_dir, broker=False, config=config), say):
        yield


def down_all(work_dir: Path, say: Report = _quiet) -> None:
    """Stop every part running under `work_dir`, whoever started it, newest first: the cluster
    (in `<work_dir>/cluster`), the services, the broker."""
    from tailguard.broker.embedded import EmbeddedBroker
    from tailguard.cluster.local import STATE_FILE, ClusterError, LocalCluster
    from tailguard.shell import supervisor

    directory = work_dir / "cluster"
    if (directory / STATE_FILE).exists():
        try:
            LocalCluster.attach(directory).stop()
            say("cluster stopped")
        except ClusterError as err:
            say(f"cluster: {err}")
    names = list(supervisor.running(work_dir))
    if names:
        supervisor.stop(work_dir, names, report=lambda m: say(f"service {m}"))
    embedded = EmbeddedBroker(work_dir, report=say)
    state = embedded.status()
    if embedded.stop():
        say(f"broker stopped (pid {state.pid if state else '?'})")


def status(work_dir: Path) -> dict[str, tuple[bool, str]]:
    """Each part under `work_dir`: whether it runs (all of it: every service ready, every
    Spark daemon alive), and a line saying how it is."""
    from tailguard.broker.embedded import EmbeddedBroker
    from tailguard.cluster.local import ClusterError, LocalCluster
    from tailguard.shell import supervisor
    from tailguard.system.services import SERVICE_NAMES

    found: dict[str, tuple[bool, str]] = {}
    broker_state = EmbeddedBroker(work_dir).status()
    found[BROKER] = (
        (True, f"pid {broker_state.pid} at {broker_state.bootstrap}")
        if broker_state is not None
        else (False, "not running")
    )
    services = supervisor.running(work_dir)
    health = {name: service.health() for name, service in sorted(services.items())}
    missing = [n for n in SERVICE_NAMES if n not in {s.service for s in services.values()}]
    lines = [f"{name} {said}" for name, said in health.items()]
    lines += [f"{name} not running" for name in missing]
    ready = not missing and all(said == "ready" for said in health.values())
    found[SERVICES] = (ready, ", ".join(lines))
    try:
        local = LocalCluster.attach(work_dir / "cluster")
        alive = local.processes_alive()
        found[CLUSTER] = (
            alive,
            f"{local.master_url}, workers {', '.join(local.hosts())}"
            + ("" if alive else " (not all its processes run)"),
        )
    except ClusterError:
        found[CLUSTER] = (False, "not running")
    return found


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
