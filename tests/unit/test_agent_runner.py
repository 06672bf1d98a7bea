"""The slot runner over a real `multiprocessing.connection` pair, in this process: the test holds
the driver's end (a Listener on 127.0.0.1 with the job's secret), the runner `serve`s in a
thread. Then the driver side's own listener (`SparkRuntime`) with a stand-in SparkContext whose
"Spark jobs" run the runners in threads."""

from __future__ import annotations

import importlib
import pickle
import queue
import secrets
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from agent_fakes import write_parquet_input

from tailguard.agent.executor import control
from tailguard.agent.executor import runner as runner_module
from tailguard.agent.executor.attempt import AttemptKey, OutputPlan, TaskSpec
from tailguard.agent.executor.environment import tailguard_build
from tailguard.agent.executor.partitions import read_subpartitions
from tailguard.agent.executor.protocol import (
    AttemptEnded,
    AttemptProgressed,
    AttemptStarted,
    Cancel,
    Deploy,
    RunnerHello,
    Shutdown,
    receive,
    send,
)
from tailguard.agent.executor.runner import RunnerConfig, serve, until_next_report
from tailguard.agent.executor.sources import SourceDef, discover_splits
from tailguard.agent.executor.steps import OperatorStep
from tailguard.agent.executor.storage import Storage
from tailguard.model.records import Distribution, ErrorKind

GRACE_S = 5.0
WAIT_S = 20.0

# Set by `waits` when it has begun waiting (the runner runs in this process).
ENTERED = threading.Event()


def double(t: pa.Table) -> pa.Table:
    return t.append_column("double", pc.multiply(t["amount"], 2))


def waits(t: pa.Table) -> pa.Table:
    ENTERED.set()
    control.wait(30)  # ends at once with AttemptCancelled when the attempt is cancelled
    return t


class WorkerExit(BaseException):
    """Stands for os._exit in this process: a runner whose attempt ignored its cancellation."""


@pytest.fixture(autouse=True)
def no_process_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A runner ends its worker process when an attempt ignores a cancellation; here that
    would end the test run, so it raises instead (and the test fails)."""

    def exit_(code: int) -> None:
        raise WorkerExit(code)

    fake_os = SimpleNamespace(_exit=exit_, getpid=lambda: 4242)
    monkeypatch.setattr(runner_module, "os", fake_os)


@dataclass
class Driver:
    """The driver's end of one runner's connection."""

    listener: Listener
    secret: bytes
    tmp: Path
    conn: Connection | None = None
    thread: threading.Thread | None = None
    served: list[Any] = field(default_factory=list)

    def config(self, secret: bytes | None = None, runner_id: str = "h1/r1") -> RunnerConfig:
        address = self.listener.address
        assert isinstance(address, tuple)
        return RunnerConfig(
            address=address,
            secret=self.secret if secret is None else secret,
            runner_id=runner_id,
            host="h1",
            version="test",
            progress_interval_s=0.02,
            cancel_grace_s=GRACE_S,
        )

    def start_runner(self, config: RunnerConfig | None = None) -> None:
        config = config or self.config()

        def run() -> None:
            try:
                self.served.append(serve(config))
            except BaseException as err:
                self.served.append(err)

        self.thread = threading.Thread(target=run, name="test-runner", daemon=True)
        self.thread.start()

    def accept(self) -> RunnerHello:
        self.conn = self.listener.accept()
        hello = self.next()
        assert isinstance(hello, RunnerHello)
        return hello

    def send(self, message: Any) -> None:
        assert self.conn is not None
        send(self.conn, message)

    def next(self, timeout: float = WAIT_S) -> Any:
        assert self.conn is not None
        assert self.conn.poll(timeout), f"the runner sent nothing within {timeout} s"
        return receive(self.conn)

    def until_ended(self, key: AttemptKey) -> list[Any]:
        """The runner's messages up to the end of the attempt `key`."""
        messages = []
        while True:
            message = self.next()
            messages.append(message)
            if isinstance(message, AttemptEnded) and message.key == key:
                return messages

    def serve_result(self) -> Any:
        assert self.thread is not None
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive(), "serve() did not return"
        (result,) = self.served
        return result


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[Driver]:
    secret = secrets.token_bytes(32)
    listener = Listener(("127.0.0.1", 0), family="AF_INET", authkey=secret)
    d = Driver(listener, secret, tmp_path)
    yield d
    if d.conn is not None:
        d.conn.close()
    listener.close()
    if d.thread is not None:
        d.thread.join(WAIT_S)


def spec(tmp: Path, attempt: int, *steps: OperatorStep) -> TaskSpec:
    """A source → operator chain reading a small Parquet file and writing one partition."""
    path = tmp / "in.parquet"
    if not path.exists():
        write_parquet_input(path, rows=12, row_groups=3)
    source = SourceDef("parquet", (str(path),))
    splits = tuple(discover_splits(source))
    return TaskSpec(
        job_id="job",
        storage=Storage(str(tmp / "storage")),
        vertex="src→double",
        subtask=0,
        attempt=attempt,
        steps=steps or (OperatorStep("double", double),),
        source=source,
        splits=splits,
        output=OutputPlan(Distribution.FORWARD, (), 1),
        input_bytes=sum(s.bytes for s in splits),
    )


def test_hello_deploy_and_an_ok_outcome(driver: Driver) -> None:
    driver.start_runner()
    hello = driver.accept()
    # The runner reports its own tailguard build, not the driver's (config.version).
    assert (hello.runner_id, hello.host, hello.pid, hello.version) == (
        "h1/r1",
        "h1",
        4242,
        tailguard_build(),
    )
    task = spec(driver.tmp, 0)
    driver.send(Deploy.of(task))
    messages = driver.until_ended(task.key)
    assert messages[0] == AttemptStarted(task.key)
    assert all(isinstance(m, AttemptProgressed) for m in messages[1:-1])
    ended = messages[-1]
    outcome = ended.outcome
    assert outcome.ok and not outcome.cancelled, outcome.message
    assert outcome.records == 12 and outcome.input_bytes == task.input_bytes
    assert ended.run_ms > 0
    table, _ = read_subpartitions(
        task.storage,
        "job",
        "src→double",
        {0: 0},
        (0, 0),
        (0, 0),
        {(0, 0): outcome.checksums[0]},
    )
    assert table["double"].to_pylist() == [2.0 * k for k in range(12)]
    driver.send(Shutdown("the job ended"))
    assert driver.serve_result() == "shut down by the driver: the job ended"


class _NeedsAMissingModule:
    """Unpickles by importing a module the runner does not have (as a chain's code from a
    module the executors cannot import does)."""

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return importlib.import_module, ("no_such_module",)


def test_an_attempt_whose_code_cannot_be_loaded_fails_as_user_and_the_runner_goes_on(
    driver: Driver,
) -> None:
    driver.start_runner()
    driver.accept()
    key = AttemptKey("src→double", 0, 0)
    driver.send(Deploy(key, pickle.dumps(_NeedsAMissingModule())))
    ended = driver.until_ended(key)[-1]
    assert not ended.outcome.ok and ended.outcome.error is ErrorKind.USER
    assert "cannot load the attempt" in ended.outcome.message
    assert "no_such_module" in ended.outcome.message
    # An import error recurs on every executor: the failover fails the job without a restart.
    assert ended.outcome.non_recoverable
    task = spec(driver.tmp, 1)
    driver.send(Deploy.of(task))
    outcome = driver.until_ended(task.key)[-1].outcome
    assert outcome.ok and not outcome.non_recoverable
    driver.send(Shutdown())
    assert driver.serve_result().startswith("shut down by the driver")


def test_a_cooperative_cancel_ends_the_attempt_within_the_grace_and_the_runner_goes_on(
    driver: Driver,
) -> None:
    ENTERED.clear()
    driver.start_runner()
    driver.accept()
    slow = spec(driver.tmp, 1, OperatorStep("waits", waits))
    driver.send(Deploy.of(slow))
    assert driver.next() == AttemptStarted(slow.key)
    assert ENTERED.wait(WAIT_S), "the operator never ran"
    # A second deploy while busy is answered, not run (the driver never does this).
    busy = spec(driver.tmp, 2)
    driver.send(Deploy.of(busy))
    refused = driver.until_ended(busy.key)[-1].outcome
    assert not refused.ok and refused.error is ErrorKind.INFRA
    assert "is busy with src→double#0 attempt 1" in refused.message

    sent = time.perf_counter()
    driver.send(Cancel(slow.key))
    ended = driver.until_ended(slow.key)[-1]
    cancel_to_ended_ms = (time.perf_counter() - sent) * 1000.0
    print(f"cancel -> AttemptEnded: {cancel_to_ended_ms:.1f} ms (grace {GRACE_S * 1000:.0f} ms)")
    assert ended.outcome.cancelled and not ended.outcome.ok
    assert cancel_to_ended_ms < GRACE_S * 1000.0

    # The runner is still there, free for the next attempt.
    again = spec(driver.tmp, 3)
    driver.send(Deploy.of(again))
    assert driver.until_ended(again.key)[-1].outcome.ok
    # A late cancel of an attempt that already ended is ignored.
    driver.send(Cancel(slow.key))
    driver.send(Shutdown())
    assert driver.serve_result() == "shut down by the driver"


def _progress_while_waiting(driver: Driver, task: TaskSpec, reports: int) -> list[Any]:
    """Deploy `task` (whose operator waits in `waits`), collect `reports` progress messages
    or as many as come within 50 intervals of 20 ms, then cancel it."""
    ENTERED.clear()
    driver.send(Deploy.of(task))
    assert driver.next() == AttemptStarted(task.key)
    assert ENTERED.wait(WAIT_S), "the operator never ran"
    seen: list[Any] = []
    deadline = time.monotonic() + 50 * 0.02
    while len(seen) < reports and time.monotonic() < deadline:
        assert driver.conn is not None
        if driver.conn.poll(0.05):
            seen.append(driver.next())
    driver.send(Cancel(task.key))
    assert driver.until_ended(task.key)[-1].outcome.cancelled
    return [m for m in seen if isinstance(m, AttemptProgressed)]


@pytest.mark.parametrize(
    ("elapsed", "expected"),
    [(0.0, 0.25), (0.01, 0.24), (0.254, 0.246), (0.74, 0.01), (0.75, 0.25), (1.9, 0.1)],
)
def test_reports_keep_to_the_attempts_grid_whatever_the_loop_costs(
    elapsed: float, expected: float
) -> None:
    # Woken 4 ms late (0.254 s), the loop sleeps 246 ms, not 250: the next report is at 0.5 s,
    # not 0.504 s. Woken more than an interval late (1.9 s), it waits for the next grid point.
    assert until_next_report(elapsed, 0.25) == pytest.approx(expected)


def test_an_attempt_still_reading_reports_every_interval_and_one_that_read_all_does_not(
    driver: Driver,
) -> None:
    # The slow-host rule judges an attempt after `min-reports` reports at its last report's
    # time: an attempt whose reads stall (a slow disk) must keep reporting, unchanged, or it
    # is judged only after as many slow reads.
    driver.start_runner()
    driver.accept()
    # Batch by batch, 4 rows each, the operator waiting in the first batch: 4 of 12 rows read.
    reading = replace(
        spec(driver.tmp, 0, OperatorStep("waits", waits, "map_batches")), batch_rows=4
    )
    stalled = _progress_while_waiting(driver, reading, reports=5)
    assert len(stalled) == 5
    assert {(m.records_read, m.bytes_read) for m in stalled[1:]} == {(4, reading.splits[0].bytes)}
    # The whole input first (a map), then the wait: all read, nothing more to report.
    whole = spec(driver.tmp, 1, OperatorStep("waits", waits))
    done = _progress_while_waiting(driver, whole, reports=3)
    # Reports while the row groups are read (moving reads) may come first; once all is read,
    # that report is sent once and never repeated.
    read = [(m.records_read, m.bytes_read) for m in done if m.bytes_read]
    assert read[-1] == (12, whole.input_bytes)
    assert read.count((12, whole.input_bytes)) == 1
    driver.send(Shutdown())
    assert driver.serve_result() == "shut down by the driver"


def test_the_runner_ends_when_the_driver_goes_away(driver: Driver) -> None:
    driver.start_runner()
    driver.accept()
    assert driver.conn is not None
    driver.conn.close()
    driver.conn = None
    assert driver.serve_result() == "the driver closed the connection"


# ------------------------------------------------------------------------------ the secret

UNPICKLED = threading.Event()


def _mark_unpickled() -> None:
    UNPICKLED.set()


class Bomb:
    """Runs code when unpickled."""

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return (_mark_unpickled, ())


def test_a_peer_without_the_secret_is_refused_on_both_ends(driver: Driver) -> None:
    # A runner with another secret: the driver's listener refuses it, and the runner refuses a
    # driver that cannot prove the runner's secret.
    driver.start_runner(driver.config(secret=b"not the job's secret"))
    with pytest.raises(AuthenticationError):
        driver.listener.accept()
    assert isinstance(driver.serve_result(), AuthenticationError)


def test_nothing_from_an_unauthenticated_client_is_unpickled(driver: Driver) -> None:
    UNPICKLED.clear()
    payload = pickle.dumps(Bomb())
    address = driver.listener.address
    assert isinstance(address, tuple)
    with socket.create_connection(address, timeout=WAIT_S) as raw:
        # A framed pickle where the answer to the challenge belongs, without any handshake.
        raw.sendall(struct.pack("!i", len(payload)) + payload)
        with pytest.raises(AuthenticationError):
            driver.listener.accept()
    assert not UNPICKLED.is_set()
    pickle.loads(payload)  # the bomb is live: had it been unpickled, we would know
    assert UNPICKLED.is_set()


# ------------------------------------------------------------------------------ SparkRuntime


class FakeRDD:
    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def mapPartitions(self, fn: Any) -> FakeRDD:
        return FakeRDD(list(fn(iter(self.items))))

    def collect(self) -> list[Any]:
        return self.items


class FakeSparkContext:
    """A local master whose one-partition jobs run the runners in the calling thread (the
    method names are Spark's)."""

    master = "local[1]"

    def __init__(self, cores: int) -> None:
        self.defaultParallelism = cores
        self.cancelled: list[str] = []

    def getConf(self) -> Any:
        conf = {"spark.task.maxFailures": "1", "spark.speculation": "false"}
        return SimpleNamespace(get=lambda key, default=None: conf.get(key, default))

    def setJobGroup(self, *args: Any, **kwargs: Any) -> None:
        pass

    def getLocalProperty(self, key: str) -> str | None:
        return None

    def setLocalProperty(self, key: str, value: str | None) -> None:
        pass

    def addJobTag(self, tag: str) -> None:
        pass

    def removeJobTag(self, tag: str) -> None:
        pass

    def parallelize(self, items: list[Any], slices: int) -> FakeRDD:
        return FakeRDD(items)

    def cancelJobsWithTag(self, tag: str) -> None:
        self.cancelled.append(tag)


@pytest.fixture
def spark_runtime() -> Iterator[tuple[Any, FakeSparkContext, queue.Queue[Any]]]:
    from tailguard.agent.adapters.spark import SparkRuntime
    from tailguard.model.config import Settings

    sc = FakeSparkContext(cores=1)
    settings = Settings({"tailguard.runner.cancel-grace": "500 ms"})
    runtime = SparkRuntime(SimpleNamespace(sparkContext=sc), settings)  # type: ignore[arg-type]
    inbox: queue.Queue[Any] = queue.Queue()
    yield runtime, sc, inbox
    runtime.close()


def next_of(inbox: queue.Queue[Any], cls: type, timeout: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            message = inbox.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"no {cls.__name__} within {timeout} s") from None
        if isinstance(message, cls):
            return message


def test_spark_runtime_connects_runners_and_relays_their_reports(spark_runtime, tmp_path) -> None:
    from tailguard.agent.driver.ports import FromRunner, RunnerConnected

    runtime, _, inbox = spark_runtime
    runtime.start("job", inbox.put)
    connected = next_of(inbox, RunnerConnected)
    assert (connected.host, connected.host_slots) == ("localhost", 1)
    task = spec(tmp_path, 0)
    runtime.deploy(connected.slot, task)
    reports = []
    while not reports or not isinstance(reports[-1].message, AttemptEnded):
        reports.append(next_of(inbox, FromRunner))
    assert {m.slot for m in reports} == {connected.slot}
    assert reports[0].message == AttemptStarted(task.key)
    assert reports[-1].message.outcome.ok


def test_spark_runtime_keeps_accepting_runners_after_refusing_a_peer(spark_runtime) -> None:
    from tailguard.agent.driver.ports import RunnerConnected

    runtime, sc, inbox = spark_runtime
    runtime.start("job", inbox.put)
    next_of(inbox, RunnerConnected)
    address = runtime._address
    with pytest.raises(AuthenticationError):
        Client(address, authkey=b"guess")
    # An executor joins: its runner must still be able to connect.
    sc.defaultParallelism = 2
    runtime.ensure_runners()
    assert next_of(inbox, RunnerConnected, timeout=2.0).slot.endswith("/r2")


def test_spark_runtime_refuses_a_runner_of_another_tailguard_build(
    spark_runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The check at job start passed; an executor that joined later runs other code.
    from tailguard.agent.driver.ports import RunnerConnected, RunnerLost

    runtime, _, inbox = spark_runtime
    monkeypatch.setattr(runner_module, "tailguard_build", lambda: "0.0.9+0123456789ab")
    runtime.start("job", inbox.put)
    first = inbox.get(timeout=WAIT_S)
    assert isinstance(first, RunnerLost), first
    assert first.reason.endswith("the driver closed the connection")
    assert not any(isinstance(m, RunnerConnected) for m in list(inbox.queue))
    assert runtime._failed_launches["localhost"] == 1


class UnusableExecutors(FakeSparkContext):
    """Spark's answer when an executor cannot start the Python worker at all."""

    def parallelize(self, items: list[Any], slices: int) -> FakeRDD:
        raise RuntimeError('Cannot run program "./environment/bin/python": error=2')


def test_spark_runtime_start_fails_when_the_executors_cannot_run_python() -> None:
    from tailguard.agent.adapters.spark import SparkRuntime
    from tailguard.agent.executor.environment import ExecutorEnvironmentError

    sc = UnusableExecutors(cores=2)
    runtime = SparkRuntime(SimpleNamespace(sparkContext=sc))  # type: ignore[arg-type]
    try:
        with pytest.raises(ExecutorEnvironmentError, match=r"environment/bin/python.*deploy\.md"):
            runtime.start("job", lambda _message: None)
        assert runtime._runners == {}  # no runner was launched
    finally:
        runtime.close()


STUCK = threading.Event()
RELEASE = threading.Event()


def stuck(t: pa.Table) -> pa.Table:
    STUCK.set()
    RELEASE.wait(30)  # a blocking call that never looks at the cancel flag
    return t


def test_closing_does_not_wait_for_a_runner_stuck_in_an_attempt(tmp_path: Path) -> None:
    # The job's outputs are committed when the runtime closes: a loser stuck in a blocking call
    # is cleaned up in the background, after the cancel grace, not on the caller's time.
    from tailguard.agent.adapters.spark import SparkRuntime
    from tailguard.agent.driver.ports import FromRunner, RunnerConnected
    from tailguard.model.config import Settings

    STUCK.clear()
    RELEASE.clear()
    sc = FakeSparkContext(cores=2)
    settings = Settings({"tailguard.runner.cancel-grace": "3 s"})
    runtime = SparkRuntime(SimpleNamespace(sparkContext=sc), settings)  # type: ignore[arg-type]
    inbox: queue.Queue[Any] = queue.Queue()
    try:
        runtime.start("job", inbox.put)
        busy = next_of(inbox, RunnerConnected)
        idle = next_of(inbox, RunnerConnected)
        task = spec(tmp_path, 0, OperatorStep("stuck", stuck))
        runtime.deploy(busy.slot, task)
        assert next_of(inbox, FromRunner).message == AttemptStarted(task.key)
        assert STUCK.wait(WAIT_S)
        started = time.monotonic()
        runtime.close()
        assert time.monotonic() - started < 1.5  # not the 3 s grace
        assert runtime._runners[idle.slot].job_done.is_set()  # the idle runner has ended
        stuck_runner = runtime._runners[busy.slot]
        assert not stuck_runner.job_done.is_set()
        # In the background: the runner, told to stop, gives up on its attempt after the grace
        # and ends (a real one then ends its worker process).
        assert stuck_runner.job_done.wait(WAIT_S)
    finally:
        RELEASE.set()
        runtime.close()
