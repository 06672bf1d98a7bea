"""Slot runners on Spark: one long-lived Spark task per executor core, connected to the driver.

At job start the runtime opens a listener in the driver (bound to `spark.driver.host`, guarded by
a per-job secret) and launches one runner per executor core, each as a one-partition Spark job
pinned to its host by location preference, once one Spark job has checked every executor's
Python (`environment`). A runner connects back, and from then on attempts are messages on its
connection, not Spark jobs: a pinned Spark job per attempt cost 169 ms p50, a message round trip
costs well under a millisecond (design §1).

Spark keeps doing what it is good at: executors, Python workers, loss detection. Its own retries
and speculation are off (`spark.task.maxFailures=1`, `spark.speculation=false`) because the
control plane owns both; a runner's Spark job that ends, for whatever reason, is a lost slot.
While a job runs its runners hold every executor core of the application.

In Spark's UI (on unless the user turns it off) a tailguard job's Spark jobs are one job group,
`tailguard:<job id>`, described as `executor environment check for <job name>` and `slot runner
<host> #<n> for <job name>`. Each also carries a job tag of its own, by which a single runner is
cancelled without touching the others (docs/spark-ui.md).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import secrets
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, Listener

from pyspark import SparkContext, cloudpickle
from pyspark.sql import SparkSession

from tailguard.agent.driver.ports import (
    AgentThreadFailed,
    FromRunner,
    Post,
    RunnerConnected,
    RunnerLost,
)
from tailguard.agent.executor import environment
from tailguard.agent.executor.attempt import AttemptKey, TaskSpec
from tailguard.agent.executor.protocol import (
    AttemptEnded,
    AttemptProgressed,
    AttemptStarted,
    Cancel,
    ConfigureStorage,
    Deploy,
    DriverMessage,
    RunnerHello,
    Shutdown,
    authenticate_peer,
    no_delay,
    receive,
    send,
)
from tailguard.agent.executor.runner import RunnerConfig, run_partition
from tailguard.cluster.pinning import pinned_rdd
from tailguard.filesystems import S3Options
from tailguard.model.config import Settings
from tailguard.model.durations import seconds_text

log = logging.getLogger("tailguard.agent.spark")

# What the runners' Spark jobs need from the session; set when the session is built by
# tailguard, and checked (with a warning) when the user brings their own.
REQUIRED_CONF = {
    "spark.task.maxFailures": "1",
    "spark.speculation": "false",
    "spark.locality.wait": "1h",
}

# How long the executor check at job start may wait for its answers: an application still
# waiting for executors (dynamic allocation, a YARN queue) gets them within this time.
ENVIRONMENT_CHECK_TIMEOUT_S = 120.0
# How long a connected peer has to say hello before it is dropped.
HELLO_TIMEOUT_S = 10.0
# Runners of one host that end before connecting, in a row, before the host is given up on
# (an environment problem: every further launch would fail the same way).
MAX_FAILED_LAUNCHES = 3
# The thread-local Spark properties a labelled job sets (SparkContext.setJobGroup's keys).
_LABEL_KEYS = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")


def job_group(job_id: str) -> str:
    """The Spark job group of every Spark job a tailguard job runs (shown in Spark's UI)."""
    return f"tailguard:{job_id}"


def job_tag(job_id: str, part: str) -> str:
    """The Spark job tag of one part of a tailguard job (a runner, the executor check): what
    cancels it alone. Spark refuses commas in tags."""
    return f"tailguard:{job_id}:{part}".replace(",", ";")


def executors_on_this_machine(master: str) -> bool:
    """Whether every executor of `master` runs on this machine: Spark's local modes, or a
    standalone master on a loopback address, which no other machine's worker can register with
    (the cluster `tailguard cluster up` starts is one). A `k8s://https://127.0.0.1:...` master
    is not: that is an API server reached through a tunnel, with executors elsewhere."""
    if master == "local" or master.startswith(("local[", "local-cluster[")):
        return True
    if not master.startswith("spark://"):
        return False
    hosts = [hp.rsplit(":", 1)[0].strip("[]") for hp in master[len("spark://") :].split(",")]
    return all(_is_loopback(host) for host in hosts)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may be anywhere
        return False


def session_builder(master: str, app_name: str = "tailguard") -> SparkSession.Builder:
    """A SparkSession builder with the settings the runners rely on (`REQUIRED_CONF`).

    Where every executor runs on this machine (`executors_on_this_machine`) it also makes them
    reach the driver on 127.0.0.1 and run this interpreter, the one with tailguard installed.
    Anywhere else executors can reach neither, so the driver address and the executors' Python
    are left to the user and `spark-submit` (docs/deploy.md: ship the environment with
    `spark.archives`); the check at job start says so if the executors cannot run tailguard.
    """
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in REQUIRED_CONF.items():
        builder = builder.config(key, value)
    if executors_on_this_machine(master):
        # A session built in Python takes the executors' interpreter from PYSPARK_PYTHON when
        # the context starts; `spark.pyspark.python` set on a builder is ignored (only
        # spark-submit reads it: measured with PySpark 4.3, the tasks ran plain `python3`).
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        if not master.startswith("local"):
            builder = builder.config("spark.driver.host", "127.0.0.1").config(
                "spark.driver.bindAddress", "127.0.0.1"
            )
    # The UI stays as Spark and the user configure it (on by default, port 4040 or the next
    # free one): setting spark.ui.enabled here would override spark-defaults.conf and
    # PYSPARK_SUBMIT_ARGS, the places a user turns it off. The console progress bar is off:
    # a runner's Spark job lasts the whole tailguard job and would only show one stuck bar.
    return builder.config("spark.ui.showConsoleProgress", "false")


def runner_listen_address(conf: Mapping[str, str], local: bool) -> tuple[str, str]:
    """`(bind, advertised)` of the runner listener, with the semantics of Spark's own driver
    endpoints: executors connect to `spark.driver.host`, and the socket binds
    `spark.driver.bindAddress` (which defaults to the driver host; a container binds its own
    address and advertises the name executors resolve, as on Kubernetes). Spark sets both when
    the context starts. Local mode: the executors are in this process's JVM, on loopback."""
    if local:
        return "127.0.0.1", "127.0.0.1"
    advertised = conf.get("spark.driver.host", "")
    if not advertised:
        raise ValueError(
            "spark.driver.host is not set: the runners would not know where the driver is"
        )
    return conf.get("spark.driver.bindAddress", "") or advertised, advertised


@dataclass
class _Runner:
    runner_id: str
    host: str
    tag: str  # its Spark job's tag (job_tag): cancels it alone
    description: str  # its Spark job's description in Spark's UI
    conn: Connection | None = None
    connected: bool = False
    ended: bool = False
    send_lock: threading.Lock = field(default_factory=threading.Lock)
    # Set once its Spark job has returned (the runner's process is done with its core).
    job_done: threading.Event = field(default_factory=threading.Event)
    # The attempt it was sent and has not reported the end of (None: idle).
    attempt: AttemptKey | None = None


class SparkRuntime:
    """The `Runtime` port on a SparkContext: slot runners on its executors."""

    def __init__(
        self, spark: SparkSession, settings: Settings | None = None, job_name: str | None = None
    ) -> None:
        self.sc: SparkContext = spark.sparkContext
        # For the Spark UI's job descriptions; the job id stands in where no name is given.
        self._job_name = job_name
        self.local = (self.sc.master or "").startswith("local")
        conf = self.sc.getConf()
        for key, value in REQUIRED_CONF.items():
            actual = conf.get(key)
            if actual != value and not (self.local and key == "spark.locality.wait"):
                log.warning("Spark setting %s is %r; tailguard expects %r", key, actual, value)
        settings = settings or Settings()
        self._progress_s = settings.duration_ms("slow-task-detector.check-interval") / 1000.0
        self._grace_s = settings.duration_ms("tailguard.runner.cancel-grace") / 1000.0
        # Object storage settings, credentials included: sent to each runner once it proved
        # the job secret, never put in Spark's conf or task (protocol.ConfigureStorage).
        self._storage = ConfigureStorage(S3Options.from_settings(settings))
        self._task_cpus = int(conf.get("spark.task.cpus", "1") or "1")
        self._lock = threading.Lock()
        self._runners: dict[str, _Runner] = {}
        self._failed_launches: Counter[str] = Counter()
        self._launched = 0
        self._closed = False
        self._post: Post | None = None
        self._job_id = ""
        # The job's runner key: shipped to the runners inside their Spark task, never logged.
        self._secret = secrets.token_bytes(32)
        self._listener: Listener | None = None
        self._address: tuple[str, int] | None = None
        self._build = environment.tailguard_build()

    @property
    def job_name(self) -> str:
        return self._job_name or self._job_id

    @contextlib.contextmanager
    def _labelled(self, tag: str, description: str) -> Iterator[None]:
        """The Spark jobs started in this block, on this thread, are in the job's group with
        `description` and `tag`. Spark keeps these per thread (PySpark pins a JVM thread to each
        Python thread), and the thread's own values come back afterwards: the environment check
        runs on the caller's thread, whose later Spark jobs are not tailguard's."""
        before = {key: self.sc.getLocalProperty(key) for key in _LABEL_KEYS}
        self.sc.setJobGroup(job_group(self._job_id), description, interruptOnCancel=True)
        self.sc.addJobTag(tag)
        try:
            yield
        finally:
            self.sc.removeJobTag(tag)
            for key, value in before.items():
                # None removes the property (SparkContext.setLocalProperty with null).
                self.sc.setLocalProperty(key, value)  # type: ignore[arg-type]

    # ---------------------------------------------------------------- cluster view

    def executors(self) -> dict[str, int]:
        """Host -> slots (executor cores / task cpus) of the live executors."""
        if self.local:
            return {"localhost": self.sc.defaultParallelism}
        assert self.sc._jsc is not None
        hosts: dict[str, int] = {}
        summaries = self.sc._jsc.sc().statusStore().executorList(True)
        for i in range(summaries.size()):
            summary = summaries.apply(i)
            if summary.id() == "driver" or not summary.isActive():
                continue
            host = summary.hostPort().rsplit(":", 1)[0]
            hosts[host] = hosts.get(host, 0) + int(summary.totalCores()) // self._task_cpus
        return hosts

    # ---------------------------------------------------------------- lifecycle

    def start(self, job_id: str, post: Post) -> int:
        """Check the executors' environment, open the listener, launch the runners.

        Raises `ExecutorEnvironmentError` when the executors cannot run this tailguard.

        One check job over every executor, not one per runner before it starts: measured in
        `tailguard bench` (io-slow, warm executors, load 12), a check per runner put the first
        runner's connection at 8.4 s after the job's submission, against 1.75 s with the one
        job, so the whole cluster's check is the cheaper barrier (docs/agent.md)."""
        self._job_id = job_id
        self._post = post
        self.check_executors()
        conf = self.sc.getConf()
        bind, advertised = runner_listen_address(
            {key: conf.get(key) or "" for key in ("spark.driver.host", "spark.driver.bindAddress")},
            self.local,
        )
        # No authkey here: each connection is authenticated in its own thread (see
        # `_serve_connection`), so a peer that stalls the handshake blocks no one else.
        self._listener = Listener((bind, 0), family="AF_INET")
        port = self._listener.address[1]
        self._address = (advertised, port)
        log.info("runner listener on %s:%d, advertised as %s:%d", bind, port, advertised, port)
        self.start_thread(self._accept, name="tg-runner-accept")
        return self.ensure_runners()

    def check_executors(self, timeout_s: float = ENVIRONMENT_CHECK_TIMEOUT_S) -> None:
        """One Spark task per executor core asks its Python what it is (`environment.describe`,
        shipped by value so it runs even where tailguard is missing); raises
        `ExecutorEnvironmentError` naming every problem and the fix, or returns when every
        answer matches this driver. Cost: one Spark job at job start; its Python workers are
        then reused by the runners (docs/deploy.md: 0.3 s once the workers are up)."""
        cloudpickle.register_pickle_by_value(environment)  # type: ignore[no-untyped-call]
        tasks = max(1, sum(self.executors().values()))
        tag = job_tag(self._job_id, "environment")
        timer = threading.Timer(timeout_s, self.sc.cancelJobsWithTag, (tag,))
        try:
            with self._labelled(tag, f"executor environment check for {self.job_name}"):
                timer.start()
                reports = (
                    self.sc.parallelize(range(tasks), tasks)
                    .mapPartitions(environment.describe)  # type: ignore[arg-type]
                    .collect()
                )
        except Exception as err:  # the Python worker did not even start, or no executor came
            raise environment.ExecutorEnvironmentError(
                environment.failure_message([_spark_failure(err, timeout_s)])
            ) from None
        finally:
            timer.cancel()
        problems = environment.incompatibilities(environment.this_python(), reports)
        if problems:
            raise environment.ExecutorEnvironmentError(environment.failure_message(problems))
        log.info(
            "executors checked: %s",
            ", ".join(sorted({f"{r['host']} ({r['python']})" for r in reports})),
        )

    def ensure_runners(self) -> int:
        """Launch runners for executor cores without one; returns how many were launched."""
        if self._closed or self._post is None:
            return 0
        executors = self.executors()
        with self._lock:
            live = Counter(r.host for r in self._runners.values() if not r.ended)
            stale = [
                r
                for r in self._runners.values()
                if not r.ended and not r.connected and r.host not in executors
            ]
            launches: list[_Runner] = []
            for host, slots in sorted(executors.items()):
                if self._failed_launches[host] >= MAX_FAILED_LAUNCHES:
                    continue
                for _ in range(slots - live[host]):
                    self._launched += 1
                    n = self._launched
                    runner = _Runner(
                        f"{host}/r{n}",
                        host,
                        tag=job_tag(self._job_id, f"r{n}"),
                        description=f"slot runner {host} #{n} for {self.job_name}",
                    )
                    self._runners[runner.runner_id] = runner
                    launches.append(runner)
        for runner in stale:
            # Waiting for an executor that is gone: it would wait for the locality timeout.
            self.sc.cancelJobsWithTag(runner.tag)
        for runner in launches:
            self.start_thread(self._run_job, runner, name=f"tg-runner-{runner.runner_id}")
        return len(launches)

    def _run_job(self, runner: _Runner) -> None:
        """The runner's Spark job, from launch to its end (which is the runner's end)."""
        assert self._address is not None
        config = RunnerConfig(
            address=self._address,
            secret=self._secret,
            runner_id=runner.runner_id,
            host=runner.host,
            version=self._build,
            progress_interval_s=self._progress_s,
            cancel_grace_s=self._grace_s,
        )
        reason = "its Spark task finished"
        try:
            with self._labelled(runner.tag, runner.description):
                if self.local:
                    rdd = self.sc.parallelize([config], 1)
                else:
                    rdd = pinned_rdd(self.sc, [(config, runner.host)])
                ended = rdd.mapPartitions(run_partition).collect()  # type: ignore[arg-type]
            reason = f"its Spark task finished: {ended[0] if ended else 'no answer'}"
        except Exception as err:  # the task failed: executor lost, worker process ended, ...
            reason = f"its Spark task failed: {_first_line(err)}"
        finally:
            runner.job_done.set()
        self._ended(runner, reason)

    def _ended(self, runner: _Runner, reason: str) -> None:
        with self._lock:
            if runner.ended:
                return
            runner.ended = True
            if not runner.connected:
                self._failed_launches[runner.host] += 1
            conn = runner.conn
        if conn is not None:
            conn.close()
        if not runner.connected and not self._closed:
            log.warning("slot runner %s ended before connecting: %s", runner.runner_id, reason)
        if self._post is not None and not self._closed:
            self._post(RunnerLost(runner.runner_id, reason))

    def start_thread(self, target: Callable[..., object], *args: object, name: str) -> None:
        """Start a thread that works for this job. Should it die, this job fails with its
        error (`AgentThreadFailed` in the job's inbox) and no other: several jobs may run in
        one driver process, and a process-wide hook could not tell whose thread it was."""

        def run() -> None:
            try:
                target(*args)
            except BaseException as err:
                if self._post is not None and not self._closed:
                    self._post(AgentThreadFailed(threading.current_thread().name, err))
                raise  # and the usual hook logs it with its traceback

        threading.Thread(target=run, name=name, daemon=True).start()

    # ---------------------------------------------------------------- connections

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._closed:
            try:
                conn = self._listener.accept()
            except (OSError, EOFError, AuthenticationError) as err:  # no secret, no slot
                if self._closed:
                    return
                log.warning("refused a runner connection: %s", _first_line(err))
                continue
            self.start_thread(self._serve_connection, conn, name="tg-runner-conn")

    def _serve_connection(self, conn: Connection) -> None:
        try:
            # Both ends prove the secret before anything is unpickled.
            authenticate_peer(conn, self._secret, HELLO_TIMEOUT_S)
        except (OSError, EOFError, AuthenticationError) as err:
            log.warning("refused a runner connection: %s", _first_line(err))
            conn.close()
            return
        try:
            no_delay(conn)
            if not conn.poll(HELLO_TIMEOUT_S):
                raise EOFError("no hello")
            hello = receive(conn)
        except (EOFError, OSError) as err:
            log.warning("a runner connection closed before its hello: %s", err)
            conn.close()
            return
        if not isinstance(hello, RunnerHello):
            log.warning("dropped a runner connection that began with %s", type(hello).__name__)
            conn.close()
            return
        if hello.version != self._build:
            # The check at job start passed, so this executor came later with another
            # tailguard: its runner would misread the driver's pickled attempts. It ends
            # unconnected, and after MAX_FAILED_LAUNCHES the host is given up.
            log.error(
                "refused runner %s on %s: it runs tailguard %s, the driver %s (%s)",
                hello.runner_id,
                hello.actual_host,
                hello.version,
                self._build,
                environment.FIX,
            )
            conn.close()
            return
        with self._lock:
            runner = self._runners.get(hello.runner_id)
            if runner is None or runner.ended or runner.connected:
                runner = None
            else:
                runner.conn = conn
                runner.connected = True
                self._failed_launches[runner.host] = 0
        if runner is None:
            log.warning("dropped a connection from unknown runner %s", hello.runner_id)
            conn.close()
            return
        # Before any Deploy: how the runner reaches object storage.
        self._send(runner.runner_id, self._storage)
        if runner.ended:
            return
        post = self._post
        assert post is not None
        post(RunnerConnected(runner.runner_id, runner.host, self.executors().get(runner.host, 1)))
        while True:
            try:
                message = receive(conn)
            except (EOFError, OSError):
                self._ended(runner, "its connection closed")
                return
            if isinstance(message, AttemptStarted | AttemptProgressed | AttemptEnded):
                if isinstance(message, AttemptEnded):
                    with self._lock:
                        if runner.attempt == message.key:
                            runner.attempt = None
                post(FromRunner(runner.runner_id, message, time.perf_counter()))

    def _send(self, slot: str, message: DriverMessage) -> None:
        with self._lock:
            runner = self._runners.get(slot)
        if runner is None or runner.conn is None or runner.ended:
            if runner is not None and not runner.ended:
                self._ended(runner, "not connected")
            elif runner is None and self._post is not None:
                self._post(RunnerLost(slot, "unknown runner"))
            return
        try:
            with runner.send_lock:
                send(runner.conn, message)
        except (OSError, ValueError) as err:
            self._ended(runner, f"sending to it failed: {err}")

    # ---------------------------------------------------------------- attempts

    def deploy(self, slot: str, spec: TaskSpec) -> None:
        with self._lock:
            runner = self._runners.get(slot)
            if runner is not None:
                runner.attempt = spec.key
        self._send(slot, Deploy.of(spec))

    def cancel(self, slot: str, key: AttemptKey) -> None:
        self._send(slot, Cancel(key))

    def close(self) -> None:
        """Tell every runner to stop, and return once the idle ones have ended. A runner still
        inside an attempt (a cancelled one stuck in a call that cannot see the flag) is left
        to a background thread, which cancels its Spark job once the cancel grace is over: the
        job's outputs are committed by now, and its caller need not wait for its losers."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            runners = list(self._runners.values())
            busy = [r for r in runners if r.attempt is not None and not r.ended]
        for runner in runners:
            if runner.conn is not None and not runner.ended:
                try:
                    with runner.send_lock:
                        send(runner.conn, Shutdown("the job ended"))
                except (OSError, ValueError):
                    pass
        deadline = time.monotonic() + self._grace_s + 2.0
        for runner in runners:
            # Runners that never connected wait for a core: their Spark jobs are cancelled.
            if not runner.connected and not runner.ended:
                self.sc.cancelJobsWithTag(runner.tag)
        if self._listener is not None:
            self._listener.close()
        self._reap([r for r in runners if r not in busy], deadline)
        if busy:
            threading.Thread(
                target=self._reap, args=(busy, deadline), name="tg-runner-reaper", daemon=True
            ).start()

    def _reap(self, runners: list[_Runner], deadline: float) -> None:
        """Wait for the runners' Spark jobs until `deadline`, then cancel those still running."""
        for runner in runners:
            if not runner.job_done.wait(max(0.0, deadline - time.monotonic())):
                try:
                    self.sc.cancelJobsWithTag(runner.tag)
                except Exception as err:  # the session was stopped meanwhile: nothing runs
                    log.debug("runner %s not cancelled: %s", runner.runner_id, _first_line(err))


def _spark_failure(err: BaseException, timeout_s: float) -> str:
    """What a failed check job says, in one line: the root cause of a Java-side failure (such
    as `Cannot run program "./environment/bin/python"`), or that no executor answered."""
    text = str(err)
    if "cancelled" in text.lower():
        return f"no executor answered within {seconds_text(timeout_s)}"
    java = getattr(err, "java_exception", None)
    while java is not None and java.getCause() is not None:
        java = java.getCause()
    return f"the check's Spark task failed: {_first_line(err) if java is None else java.toString()}"


def _first_line(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    return text.splitlines()[0][:500]
