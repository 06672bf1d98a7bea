"""A Spark standalone cluster on this machine, started from the pyspark wheel.

One Master on 127.0.0.1 and N Workers, worker i bound to its own loopback address 127.0.0.(i+2),
so Spark sees N distinct hosts and an attempt can be pinned to one of them by location
preference. Every daemon runs detached in its own session with its output in a log file under
`work_dir`; the pids go into `<work_dir>/cluster.json` so another process (`tailguard cluster
status|down|throttle`) can find and manage the cluster.

Spark 4 needs a full JDK 17 (it uses the `jdk.incubator.vector` module; a jlinked minimal JRE
fails), found through `JAVA_HOME` or `PATH`.

The same launcher starts the daemons on other nodes when given them (`master_node`,
`worker_nodes`): hosts of a `tailguard.cluster.netns.NamespaceNetwork`, for a cluster whose
executors share no loopback with the driver (docs/cluster.md, "Hosts in network namespaces").
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from tailguard.cluster import cpu_budget, slowness
from tailguard.cluster.netns import NetnsHost
from tailguard.jdk import java_path
from tailguard.model.durations import seconds_text
from tailguard.processes import trees
from tailguard.processes.supervised import Supervised, create_time, launch, write_json

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
THROTTLE_MODULE = "tailguard.cluster.throttle"
STATE_FILE = "cluster.json"
DEFAULT_WORK_DIR = Path("work") / "cluster"

ThrottleMode = Literal["cpu", "io"]
THROTTLE_MODES: tuple[ThrottleMode, ...] = ("cpu", "io")


# Spark's own default ports: a node with a network of its own (a namespace host) has them free.
DEFAULT_MASTER_PORT = 7077
DEFAULT_MASTER_UI_PORT = 8080
DEFAULT_WORKER_UI_PORT = 8081


@dataclass(frozen=True)
class Node:
    """Where one Spark daemon runs: its address, and the command prefix that starts a process
    there (none: this machine). A node with `own_network` has a port space of its own, so
    Spark's default ports are used; on this machine's network free ports are picked."""

    address: str
    prefix: tuple[str, ...] = ()
    own_network: bool = False

    @classmethod
    def in_namespace(cls, host: NetnsHost) -> Node:
        return cls(host.address, tuple(host.command([])), own_network=True)

    def port(self, default: int) -> int:
        return default if self.own_network else free_port(self.address)


class ClusterError(RuntimeError):
    """The local cluster cannot be started, found or managed."""


class ThrottleWarning(UserWarning):
    """A CPU throttle that will not remove the capacity it claims to (more executors than
    cores)."""


def cpu_throttle_caveat(executor_cores: int, cpus: int | None = None) -> str | None:
    """Why a SIGSTOP throttle misleads on this cluster, or None when it does what it says.

    Pausing a worker's process tree removes capacity only if the others cannot use the freed
    CPU, i.e. with no more executor cores than CPUs (design §7: with 3 executors on 2 cores a
    "5x slow" node cost plain PySpark ~1.26x).
    """
    cpus = cpus if cpus is not None else (os.cpu_count() or 1)
    if executor_cores <= cpus:
        return None
    return (
        f"CPU throttling on {executor_cores} executor cores over {cpus} CPUs: the paused "
        "node's CPU goes to the other executors, so the node loses far less capacity than "
        "the factor says (design §7: a '5x slow' node cost plain PySpark ~1.26x with 3 "
        "executors on 2 cores). Start the cluster with CPU budgets (`tailguard cluster up "
        "--cpu-budgets`, as root) to make cpu mode cut a quota instead; for I/O-bound work use "
        "mode 'io' (`--mode io`), or run no more executors than cores."
    )


def spark_home() -> Path:
    """The installed pyspark package directory: it holds `bin/spark-class` and the jars."""
    import pyspark  # deferred: importing pyspark is slow and `status`/`down` do not need it

    return Path(pyspark.__file__).resolve().parent


def find_java() -> str:
    """Path of the `java` binary, or a ClusterError that says what to install."""
    found = java_path()
    if found is None:
        raise ClusterError(
            "`java` not found: the local Spark cluster needs a JDK 17 (for example "
            "`apt-get install openjdk-17-jdk-headless`), on PATH or via JAVA_HOME"
        )
    return found


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def worker_host(index: int) -> str:
    """Loopback address of worker `index` (0-based): 127.0.0.2, 127.0.0.3, ..."""
    if not 0 <= index < 250:
        raise ValueError(f"worker index out of range: {index}")
    return f"127.0.0.{index + 2}"


@dataclass
class WorkerState:
    host: str
    pid: int
    webui_port: int
    log: str
    # The process's create time: with the pid, its identity (0: a state file from before).
    created: float = 0.0

    def ours(self) -> bool:
        return Supervised(self.pid, self.created).ours(WORKER_CLASS)


@dataclass
class ThrottleState:
    # The throttler (a "pause" throttle), or the process that lifts a timed "budget" cut (0:
    # none, the cut lasts until `unthrottle`).
    pid: int
    factor: float
    until: float | None  # wall-clock epoch seconds, None = until turned off
    created: float = 0.0
    kind: str = "pause"  # "pause": SIGSTOP duty cycle (throttle.py); "budget": cpu_budget.py

    def ours(self) -> bool:
        module = THROTTLE_MODULE if self.kind == "pause" else cpu_budget.__name__
        return self.pid > 0 and Supervised(self.pid, self.created).ours(module)


@dataclass
class ClusterState:
    """What `<work_dir>/cluster.json` holds."""

    master_url: str
    web_ui: str
    master_pid: int
    workers: list[WorkerState]
    cores: int
    memory: str
    spark_home: str
    python: str
    throttles: dict[str, ThrottleState] = field(default_factory=dict)
    master_created: float = 0.0
    # CPU budgets (cpu_budget.py): each worker's CPUs, and the cgroup hierarchy the groups are
    # in (its root and version); None: no budgets.
    budget_cores: float | None = None
    budget_root: str = ""
    budget_version: int = 0

    def master_ours(self) -> bool:
        return Supervised(self.master_pid, self.master_created).ours(MASTER_CLASS)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ClusterState:
        raw = json.loads(text)
        raw["workers"] = [WorkerState(**w) for w in raw["workers"]]
        raw["throttles"] = {h: ThrottleState(**t) for h, t in raw.get("throttles", {}).items()}
        return cls(**raw)


def master_status(web_ui: str, timeout_s: float = 2.0) -> dict[str, Any] | None:
    """The Master's JSON status (`/json/`), or None if it does not answer."""
    try:
        with urllib.request.urlopen(f"{web_ui}/json/", timeout=timeout_s) as resp:
            data: dict[str, Any] = json.load(resp)
            return data
    except (urllib.error.URLError, OSError, ValueError):
        return None


def alive_worker_hosts(status: dict[str, Any]) -> set[str]:
    return {w["host"] for w in status.get("workers", []) if w.get("state") == "ALIVE"}


class LocalCluster:
    """Start, find, throttle and stop the local standalone cluster.

    `start()` reuses a live cluster of the same shape recorded in the state file, so `up` is
    idempotent; a live cluster of another shape is an error (stop it first).
    """

    def __init__(
        self,
        workers: int = 3,
        cores: int = 1,
        memory: str = "1g",
        work_dir: Path = DEFAULT_WORK_DIR,
        master_port: int | None = None,
        start_timeout_s: float = 90.0,
        progress: Callable[[str], None] | None = None,
        master_node: Node | None = None,
        worker_nodes: list[Node] | None = None,
        cpu_budgets: bool = False,
    ) -> None:
        """`workers` loopback workers (127.0.0.2, ...) and a master on 127.0.0.1, or the
        daemons on the given nodes (`worker_nodes` overrides `workers`): hosts of a
        `NamespaceNetwork` for a cluster whose executors reach the driver only over a network
        (tests/integration/test_multihost.py).

        `cpu_budgets`: each worker's process tree gets a cgroup CPU quota of its share of the
        machine (`cpu_budget.py`), so a cpu-mode slowness cuts that quota and the node really
        loses capacity however many workers share the CPUs."""
        if worker_nodes is not None:
            workers = len(worker_nodes)
        if workers < 1:
            raise ValueError("a cluster needs at least one worker")
        self.master_node = master_node or Node("127.0.0.1")
        self.worker_nodes = worker_nodes or [Node(worker_host(i)) for i in range(workers)]
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.cpu_budgets = cpu_budgets
        self.work_dir = Path(work_dir).resolve()
        self.master_port = master_port
        self.start_timeout_s = start_timeout_s
        self._progress = progress or (lambda _msg: None)
        self.state: ClusterState | None = None
        # The daemons this instance launched. While starting, their exit status is the reliable
        # liveness check: the /proc command line is briefly empty while spark-class execs java.
        self._children: list[subprocess.Popen[bytes]] = []
        # Set when this instance launched the daemons (not when it reused a running cluster).
        self.started_here = False

    # ----------------------------------------------------------------- finding
    @property
    def state_path(self) -> Path:
        return self.work_dir / STATE_FILE

    @classmethod
    def attach(cls, work_dir: Path = DEFAULT_WORK_DIR) -> LocalCluster:
        """The cluster recorded in `<work_dir>/cluster.json` (started by any process)."""
        state = cls._read_state(Path(work_dir).resolve())
        if state is None:
            raise ClusterError(f"no cluster state file in {Path(work_dir).resolve()}")
        # max(1, ...): a start interrupted before its first worker still has to be stoppable.
        cluster = cls(max(1, len(state.workers)), state.cores, state.memory, work_dir)
        cluster.state = state
        return cluster

    @staticmethod
    def _read_state(work_dir: Path) -> ClusterState | None:
        path = work_dir / STATE_FILE
        try:
            return ClusterState.from_json(path.read_text())
        except FileNotFoundError:
            return None
        except (ValueError, TypeError, KeyError) as exc:
            raise ClusterError(f"unreadable cluster state file {path}: {exc}") from exc

    def _refresh(self) -> ClusterState:
        """Re-read the state file: another process (the CLI) may have changed the throttles."""
        on_disk = self._read_state(self.work_dir)
        if on_disk is not None:
            self.state = on_disk
        return self._require_state()

    def _write_state(self) -> None:
        assert self.state is not None
        write_json(self.state_path, asdict(self.state))  # never seen half-written

    @property
    def master_url(self) -> str:
        return self._require_state().master_url

    def hosts(self) -> list[str]:
        """The worker addresses, in worker order."""
        if self.state is not None:
            return [w.host for w in self.state.workers]
        return [node.address for node in self.worker_nodes]

    def _require_state(self) -> ClusterState:
        if self.state is None:
            raise ClusterError("the cluster is not started")
        return self.state

    def processes_alive(self) -> bool:
        """Master and every worker process are still running."""
        state = self._require_state()
        return state.master_ours() and all(w.ours() for w in state.workers)

    def without_io_slowness(self) -> list[str]:
        """Hosts whose worker was started without the slowness file in its environment (a
        cluster started by an older tailguard): their tasks always see factor 1."""
        return [
            w.host
            for w in self._require_state().workers
            if slowness.ENV_VAR not in trees.environ(w.pid)
        ]

    def status(self) -> dict[str, Any]:
        """A summary for `tailguard cluster status`: processes, Master's view, throttles."""
        state = self._require_state()
        master = master_status(state.web_ui)
        alive = alive_worker_hosts(master) if master else set()
        now = time.time()
        return {
            "master_url": state.master_url,
            "web_ui": state.web_ui,
            "master": {"pid": state.master_pid, "running": state.master_ours()},
            "master_answers": master is not None,
            "workers": [
                {
                    "host": w.host,
                    "pid": w.pid,
                    "running": w.ours(),
                    "registered": w.host in alive,
                    "throttle": self._throttle_summary(w.host, now),
                }
                for w in state.workers
            ],
            "cores": state.cores,
            "memory": state.memory,
            "cpu_budget_cores": state.budget_cores,
        }

    def _throttle_summary(self, host: str, now: float) -> dict[str, Any] | None:
        t = self._require_state().throttles.get(host)
        if t is not None and t.kind == "budget" and (t.until is None or t.until > now):
            left = None if t.until is None else t.until - now
            cores = self._budget(host).cores()
            return {"mode": "cpu", "factor": t.factor, "cpu_cores": cores, "seconds_left": left}
        if t is not None and t.ours():
            left = None if t.until is None else max(0.0, t.until - now)
            return {"mode": "cpu", "factor": t.factor, "pid": t.pid, "seconds_left": left}
        slow = slowness.read(slowness.slowness_file(self.work_dir, host))
        if slow is None:
            return None
        starts_in = None if slow.since is None or slow.since <= now else slow.since - now
        if starts_in is not None or slow.factor_at(now) > 1.0:
            left = None if slow.until is None else max(0.0, slow.until - now)
            return {
                "mode": "io",
                "factor": slow.factor,
                "pid": None,
                "seconds_left": left,
                "starts_in": starts_in,
            }
        return None

    # ----------------------------------------------------------------- starting
    def start(self, before_launch: Callable[[Path], None] | None = None) -> str:
        """Start (or reuse) the cluster; returns the master URL once every worker is ALIVE.
        `before_launch(work_dir)` is called before a launch, never for a reused cluster."""
        existing = self._read_state(self.work_dir)
        if existing is not None:
            self.state = existing
            if self.processes_alive():
                budgets = existing.budget_cores is not None
                if (len(existing.workers), existing.cores, existing.memory, budgets) != (
                    self.workers,
                    self.cores,
                    self.memory,
                    self.cpu_budgets,
                ):
                    raise ClusterError(
                        f"a cluster of another shape ({len(existing.workers)} workers, "
                        f"{existing.cores} cores, {existing.memory}, CPU budgets "
                        f"{'on' if budgets else 'off'}) is running from "
                        f"{self.state_path}; stop it first (`tailguard cluster down`)"
                    )
                self._progress(f"reusing the running cluster at {existing.master_url}")
                self._await_workers()
                if stale := self.without_io_slowness():
                    self._progress(
                        f"warning: workers {', '.join(stale)} were started without "
                        f"{slowness.ENV_VAR}: I/O-mode slowness cannot reach their tasks "
                        "(restart the cluster: `tailguard cluster down`, then `up`)"
                    )
                return existing.master_url
            self._progress("the recorded cluster is no longer complete; replacing it")
            self.stop()
        if before_launch is not None:
            before_launch(self.work_dir)
        return self._launch()

    def _launch(self) -> str:
        budgets = self._budget_hierarchy()
        java = find_java()
        home = spark_home()
        spark_class = home / "bin" / "spark-class"
        logs = self.work_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        base_env = {
            **os.environ,
            "SPARK_HOME": str(home),
            "JAVA_HOME": os.environ.get("JAVA_HOME") or str(Path(java).resolve().parents[1]),
            "SPARK_LOG_DIR": str(logs),
            # Keep Spark's default conf dir from leaking a user's spark-defaults into tests.
            "SPARK_CONF_DIR": str(self.work_dir / "conf"),
        }
        if not self.master_node.own_network:
            # This machine's cluster: executors may run this interpreter, which has tailguard.
            # Nodes with a network of their own stand for other machines: their executors get
            # Python from the job (a shipped environment), as they would there.
            base_env["PYSPARK_PYTHON"] = sys.executable
        (self.work_dir / "conf").mkdir(exist_ok=True)
        master = self.master_node
        master_port = self.master_port or master.port(DEFAULT_MASTER_PORT)
        webui_port = master.port(DEFAULT_MASTER_UI_PORT)
        master_url = f"spark://{master.address}:{master_port}"
        web_ui = f"http://{master.address}:{webui_port}"

        self._progress(f"starting Spark master at {master_url} (web UI {web_ui})")
        master_proc = self._spawn(
            [
                *master.prefix,
                str(spark_class),
                MASTER_CLASS,
                "--host",
                master.address,
                "--port",
                str(master_port),
                "--webui-port",
                str(webui_port),
            ],
            {**base_env, "SPARK_LOCAL_IP": master.address},
            logs / "master.log",
        )
        self._children = [master_proc]
        self.state = ClusterState(
            master_url=master_url,
            web_ui=web_ui,
            master_pid=master_proc.pid,
            master_created=create_time(master_proc.pid) or 0.0,
            workers=[],
            cores=self.cores,
            memory=self.memory,
            spark_home=str(home),
            python=sys.executable,
        )
        if budgets is not None:
            self.state.budget_cores = cpu_budget.share_cores(len(self.worker_nodes), self.cores)
            self.state.budget_root = str(budgets.root)
            self.state.budget_version = budgets.version
        self._write_state()  # from here on, `down` can clean up even a half-started cluster
        try:
            self._await(lambda: master_status(web_ui, 1.0) is not None, "the master's web UI")
            for i, node in enumerate(self.worker_nodes):
                host = node.address
                worker_dir = self.work_dir / f"worker-{i + 2}"
                worker_dir.mkdir(parents=True, exist_ok=True)
                port = node.port(DEFAULT_WORKER_UI_PORT)
                self._progress(f"starting worker {host} ({self.cores} cores, {self.memory})")
                proc = self._spawn(
                    [
                        *node.prefix,
                        str(spark_class),
                        WORKER_CLASS,
                        "--host",
                        host,
                        "--cores",
                        str(self.cores),
                        "--memory",
                        self.memory,
                        "--webui-port",
                        str(port),
                        master_url,
                    ],
                    {
                        **base_env,
                        "SPARK_LOCAL_IP": host,
                        "SPARK_WORKER_DIR": str(worker_dir),
                        # Inherited by executors and Python workers: where a task reads its
                        # host's I/O slowness (`tailguard.cluster.slowness`).
                        slowness.ENV_VAR: str(slowness.slowness_file(self.work_dir, host)),
                    },
                    logs / f"worker-{host}.log",
                )
                self._children.append(proc)
                if budgets is not None:
                    budget = self._budget(host).create()
                    budget.set_cores(self.state.budget_cores or 0)
                    # Before the worker forks its executor: what it starts is born in the group.
                    budget.add(proc.pid)
                self.state.workers.append(
                    WorkerState(
                        host,
                        proc.pid,
                        port,
                        str(logs / f"worker-{host}.log"),
                        create_time(proc.pid) or 0.0,
                    )
                )
                self._write_state()
            self._await_workers()
        except BaseException:
            self.stop()
            raise
        self.started_here = True
        self._progress(f"cluster up: {master_url}, workers {', '.join(self.hosts())}")
        return master_url

    def _budget_hierarchy(self) -> cpu_budget.Hierarchy | None:
        if not self.cpu_budgets:
            return None
        found = cpu_budget.hierarchy()
        if found is None:
            raise ClusterError(
                "CPU budgets need a writable cgroup hierarchy with CPU bandwidth control "
                f"(cgroup v1's cpu controller at {cpu_budget.V1_ROOT}, or v2 with cpu among "
                "cgroup.controllers): run as root, or start the cluster without CPU budgets"
            )
        return found

    def _budget(self, host: str) -> cpu_budget.CpuBudget:
        state = self._require_state()
        hierarchy = cpu_budget.Hierarchy(Path(state.budget_root), state.budget_version)
        return hierarchy.group(cpu_budget.group_name(self.work_dir, host))

    @staticmethod
    def _spawn(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        # Own session and process group: survives the launching CLI.
        return launch(argv, log, env=env)

    def _await_workers(self) -> None:
        state = self._require_state()
        wanted = set(self.hosts())
        self._progress(f"waiting for {len(wanted)} workers to register with the master")
        self._await(
            lambda: (
                (s := master_status(state.web_ui, 1.0)) is not None
                and wanted <= alive_worker_hosts(s)
            ),
            f"workers {', '.join(sorted(wanted))} to register as ALIVE",
        )

    def _launched_alive(self) -> bool:
        if self._children:
            return all(child.poll() is None for child in self._children)
        return self.processes_alive()

    def _await(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while not condition():
            if not self._launched_alive():
                raise ClusterError(
                    f"a Spark daemon exited while waiting for {what}; see the logs in "
                    f"{self.work_dir / 'logs'}"
                )
            if time.monotonic() >= deadline:
                raise ClusterError(
                    f"timed out after {seconds_text(self.start_timeout_s)} waiting for {what}; see "
                    f"{self.work_dir / 'logs'}"
                )
            time.sleep(0.2)

    # ----------------------------------------------------------------- throttling
    def worker(self, host: str) -> WorkerState:
        for w in self._require_state().workers:
            if w.host == host:
                return w
        raise ClusterError(f"no worker {host}; workers are {', '.join(self.hosts())}")

    def throttle(
        self,
        host: str,
        factor: float,
        duration_s: float | None = None,
        period_ms: float = 100,
        mode: ThrottleMode = "cpu",
        after_s: float | None = None,
    ) -> int | None:
        """Slow `host` down `factor` times (for `duration_s`, or until `unthrottle`; in io mode
        from `after_s` seconds on: a node that turns slow mid-job).

        - `mode="cpu"` on a cluster with CPU budgets: the worker's quota is cut to its share
          over `factor` (returns the pid of the process that lifts it after `duration_s`, or
          None). Its executor keeps running, at that speed.
        - `mode="cpu"` without budgets: a throttler process pauses and resumes the worker's
          process tree (returns its pid). Throttle only after the host's executor has
          registered: an executor that starts on a throttled node registers late. With more
          executor cores than CPUs this misleads; it still runs, with a `ThrottleWarning` that
          says why.
        - `mode="io"`: the host's slowness file, which `slowness.io_work` in the tasks there
          reads (returns None). Takes effect on running tasks within 100 ms.
        A host has one slowness at a time: this lifts the previous one of either mode.
        """
        if mode not in THROTTLE_MODES:
            raise ValueError(f"mode must be one of {THROTTLE_MODES}, not {mode!r}")
        if after_s and mode != "io":
            # A pause that starts later would need a throttler process waiting to start it;
            # the io mode's file holds its own start, so no process has to stay alive.
            raise ValueError("a later start (after_s) is for the io mode only")
        self.unthrottle(host)  # also re-reads the state file and checks the host
        if mode == "io":
            slowness.write(
                slowness.slowness_file(self.work_dir, host), factor, duration_s, after_s=after_s
            )
            return None
        state = self._require_state()
        if state.budget_cores is not None:
            return self._cut_budget(host, factor, duration_s)
        caveat = cpu_throttle_caveat(len(state.workers) * state.cores)
        if caveat is not None:
            self._progress(f"warning: {caveat}")
            warnings.warn(caveat, ThrottleWarning, stacklevel=2)
        worker = self.worker(host)
        argv = [
            sys.executable,
            "-m",
            THROTTLE_MODULE,
            "--pid",
            str(worker.pid),
            "--factor",
            str(factor),
            "--period-ms",
            str(period_ms),
        ]
        if duration_s is not None:
            argv += ["--for", str(duration_s)]
        log = self.work_dir / "logs" / f"throttle-{host}.log"
        proc = self._spawn(argv, dict(os.environ), log)
        state = self._require_state()
        until = None if duration_s is None else time.time() + duration_s
        state.throttles[host] = ThrottleState(proc.pid, factor, until, create_time(proc.pid) or 0.0)
        self._write_state()
        return proc.pid

    def _cut_budget(self, host: str, factor: float, duration_s: float | None) -> int | None:
        if factor < 1:
            raise ValueError(f"factor must be >= 1 (1 = not slowed), got {factor}")
        state = self._require_state()
        share = state.budget_cores or 0
        budget = self._budget(host)
        budget.set_cores(share / factor)
        pid = None
        if duration_s is not None:
            argv = [
                sys.executable,
                "-m",
                cpu_budget.__name__,
                "--root",
                str(budget.hierarchy.root),
                "--version",
                str(budget.version),
                "--group",
                budget.name,
                "--cores",
                str(share),
                "--after",
                str(duration_s),
            ]
            pid = self._spawn(
                argv, dict(os.environ), self.work_dir / "logs" / f"budget-{host}.log"
            ).pid
        until = None if duration_s is None else time.time() + duration_s
        created = (create_time(pid) or 0.0) if pid is not None else 0.0
        state.throttles[host] = ThrottleState(pid or 0, factor, until, created, kind="budget")
        self._write_state()
        return pid

    def unthrottle(self, host: str) -> None:
        """Stop slowing `host` (either mode); its processes are running again when this
        returns, and its tasks see factor 1 from their next tick on."""
        state = self._refresh()
        worker = self.worker(host)
        slowness.clear(slowness.slowness_file(self.work_dir, host))
        t = state.throttles.pop(host, None)
        if t is not None:
            if t.ours():
                trees.terminate_trees([t.pid], grace_s=5.0)
            self._write_state()
        if state.budget_cores is not None:
            self._budget(host).set_cores(state.budget_cores)
        # Belt and braces: a throttler killed with SIGKILL could not resume the tree itself.
        trees.signal_all(trees.descendants(worker.pid), signal.SIGCONT)

    # ----------------------------------------------------------------- stopping
    def stop(self, grace_s: float = 10.0) -> None:
        """Terminate every process this cluster started and remove the state file."""
        state = self._read_state(self.work_dir) or self.state
        if state is None:
            return
        self.state = state
        for host in list(state.throttles):
            with contextlib.suppress(ClusterError):
                self.unthrottle(host)
        roots = [w.pid for w in state.workers if w.ours()]
        if state.master_ours():
            roots.append(state.master_pid)
        self._progress(f"stopping {len(roots)} Spark daemons")
        trees.terminate_trees(roots, grace_s)
        for w in state.workers:  # a later cluster in this dir starts healthy
            slowness.clear(slowness.slowness_file(self.work_dir, w.host))
            if state.budget_cores is not None:
                self._budget(w.host).remove()
        self.state_path.unlink(missing_ok=True)
        self.state = None

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
