"""The tailguard pytest plugin: fixtures for the embedded broker, a local Spark cluster with
optional slow hosts, a local Spark session and the five services (docs/testing.md).

Registered as a `pytest11` entry point, so any pytest run in an environment with tailguard
installed has it. It imports nothing heavy until a fixture is used.

| fixture                 | scope    | gives                               | first use costs     |
|-------------------------|----------|-------------------------------------|---------------------|
| `tailguard_harness`     | session  | the `Harness` (for module fixtures) | nothing             |
| `tailguard_broker`      | session  | `Broker` (`.bootstrap`)             | ~10 s (mock ~1 s)   |
| `tailguard_cluster`     | function | `LocalCluster`, slow hosts applied  | ~10-15 s per shape  |
| `tailguard_spark`       | function | `SparkSession` on that cluster      | ~5 s + registration |
| `tailguard_local_spark` | function | `SparkSession` on `local[2]`        | ~5 s                |
| `tailguard_services`    | function | `Services` (`.settings`, `.kill()`) | ~10 s per settings  |

The function-scoped ones are cheap after the first use: they hand out the session's shared
resources, shaped by the closest `tailguard_cluster`, `tailguard_spark` and
`tailguard_services` markers (test, class or module `pytestmark`). A module-scoped fixture of
your own gets the same from the harness: `tailguard_harness.spark_of(request.node)`.

A run stopped from outside still stops what it started: SIGTERM (and SIGHUP) is turned into an
interrupt, as Ctrl-C's SIGINT is, so pytest runs every fixture's teardown (for at most
`TEARDOWN_LIMIT_S`); a run killed with SIGKILL is cleaned up by its watchdog as it ends
(tailguard.testing.watchdog), and by the next session that uses the harness, from its ledger
and its mark (tailguard.testing.leftovers).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tailguard.testing import leftovers, watchdog
from tailguard.testing.harness import Broker, Harness, Services
from tailguard.testing.markers import Defaults, HarnessUsageError, read_defaults

OPTIONS = {
    "tailguard_workers": "workers of the local cluster (default 3)",
    "tailguard_worker_cores": "cores per worker (default 1)",
    "tailguard_worker_memory": "memory per worker (default 1g)",
    "tailguard_slow_mode": "how slow hosts are slowed: cpu (pause the worker) or io (default cpu)",
    "tailguard_local_master": "the master of tailguard_local_spark (default local[2])",
    "tailguard_broker": (
        "the session's broker: kafka (Apache Kafka's broker, the default) or mock (librdkafka's "
        "in-memory mock, for a machine that cannot reach Maven Central)"
    ),
    "tailguard_work_dir": (
        "where the broker, cluster and services keep their state (default: a temporary dir); "
        "what is already running there is reused and left running"
    ),
    "tailguard_ledger_dir": (
        "where each session writes down the processes it starts, so the next session stops "
        "those of a killed run (default: $TAILGUARD_HARNESS_LEDGERS, else "
        "<tmp>/tailguard-harness-<uid>)"
    ),
}
MARKERS = (
    "tailguard_cluster(workers=3, cores=1, memory='1g', slow={host: factor}, slow_mode='cpu'): "
    "the local cluster the tailguard_cluster and tailguard_spark fixtures give",
    "tailguard_spark(conf={...}): extra Spark settings for tailguard_spark/tailguard_local_spark",
    "tailguard_services(settings={...}, names=[...]): the services' settings (policy) and which "
    "services run",
)
HARNESS = pytest.StashKey[Harness]()
REAPED = pytest.StashKey[list[str]]()
# SIGTERM: what CI runners, timeouts and `kill` send; SIGHUP: a closed terminal or ssh session.
INTERRUPTING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
# How long the teardown after such a signal may take before the process ends anyway (the
# watchdog then stops what is left, within its own 10 s grace): whoever sent the signal expects
# the run, and everything it started, gone within a minute.
TEARDOWN_LIMIT_S = 40.0


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP during a session that uses the harness, raised as Ctrl-C's
    KeyboardInterrupt is: pytest then stops, runs every fixture's teardown (the harness stops
    what it started) and exits 2, interrupted. Python's default for these signals ends the
    process at once, with no teardown (checked: pytest 8 installs no handler of its own)."""


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """While the harness holds processes, SIGTERM/SIGHUP interrupt pytest instead of killing
    it. A signal someone else already handles (a conftest, pytest-xdist) is left to them."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return
    ours = [sig for sig in INTERRUPTING_SIGNALS if signal.getsignal(sig) == signal.SIG_DFL]
    limits: list[threading.Timer] = []

    def interrupt(signum: int, _frame: object) -> None:
        # A second signal ends the run at once: the next session reaps what is left. Only the
        # signals still ours: a handler set since (a test's, a plugin's) is theirs to keep.
        for sig in ours:
            if signal.getsignal(sig) is interrupt:
                signal.signal(sig, signal.SIG_DFL)
        # Until the harness has stopped what it started (the end of this block, after its
        # teardown): the process may go on after that (a test of this very handler does).
        limit = threading.Timer(TEARDOWN_LIMIT_S, _end_now, (signal.Signals(signum).name,))
        limit.daemon = True
        limits.append(limit)
        limit.start()
        raise Terminated(
            f"{signal.Signals(signum).name}: the tailguard harness stops what it started"
        )

    for sig in ours:
        signal.signal(sig, interrupt)
    try:
        yield
    finally:
        for limit in limits:
            limit.cancel()
        for sig in ours:
            if signal.getsignal(sig) is interrupt:
                signal.signal(sig, signal.SIG_DFL)


def _end_now(signal_name: str) -> None:
    print(
        f"\n{signal_name}: the teardown took over {TEARDOWN_LIMIT_S:.0f} s; ending now (the "
        "harness's watchdog stops what is left)",
        file=sys.stderr,
        flush=True,
    )
    os._exit(2)


DEFAULTS = pytest.StashKey[Defaults]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("tailguard", "tailguard test harness")
    for name, help_text in OPTIONS.items():
        parser.addini(name, help_text, default=None)
        group.addoption(f"--{name.replace('_', '-')}", dest=name, default=None, help=help_text)


def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    # Checked here, so a bad value stops the run before any test (exit 4, a usage error).
    try:
        config.stash[DEFAULTS] = read_defaults({name: _setting(config, name) for name in OPTIONS})
    except HarnessUsageError as err:
        raise pytest.UsageError(str(err)) from None


def _setting(config: pytest.Config, name: str) -> str | None:
    value = config.getoption(name)
    if value is None:
        value = config.getini(name)
    return None if value is None else str(value)


def _usage(call: Any, *args: Any) -> Any:
    """Call into the harness; a misused marker fails the test with just its message."""
    try:
        return call(*args)
    except HarnessUsageError as err:
        pytest.fail(str(err), pytrace=False)


@pytest.fixture(scope="session")
def tailguard_harness(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Harness]:
    """The session's shared broker, cluster, Spark session and services."""
    config = request.config
    configured = _setting(config, "tailguard_work_dir")
    root = Path(configured) if configured else tmp_path_factory.mktemp("tailguard")
    ledgers = _setting(config, "tailguard_ledger_dir")
    ledger_dir = Path(ledgers) if ledgers else leftovers.default_ledger_dir()
    # Before anything starts: what a killed run left would hold ports and memory.
    config.stash[REAPED] = leftovers.reap(ledger_dir)
    ledger = leftovers.Ledger(ledger_dir)
    watchdog.start(ledger)
    # Every process started from here on carries the session's mark, whoever starts it.
    outer_mark = os.environ.get(leftovers.MARK_ENV)
    os.environ[leftovers.MARK_ENV] = ledger.mark
    harness = Harness(root, config.stash[DEFAULTS], java_missing=pytest.skip, ledger=ledger)
    config.stash[HARNESS] = harness
    with signals_interrupt():
        try:
            yield harness
        finally:
            harness.close()
            if outer_mark is None:
                os.environ.pop(leftovers.MARK_ENV, None)
            else:
                os.environ[leftovers.MARK_ENV] = outer_mark


@pytest.fixture(scope="session")
def tailguard_broker(tailguard_harness: Harness) -> Broker:
    """The embedded broker (`.bootstrap` is its address)."""
    return tailguard_harness.broker()


@pytest.fixture
def tailguard_cluster(tailguard_harness: Harness, request: pytest.FixtureRequest) -> Iterator[Any]:
    """The local cluster the `tailguard_cluster` marker asks for, its slow hosts slowed for
    the test."""
    cluster = _usage(tailguard_harness.cluster_of, request.node)
    with _usage(tailguard_harness.slow_hosts_of, request.node):
        yield cluster


@pytest.fixture
def tailguard_spark(
    tailguard_harness: Harness, tailguard_cluster: Any, request: pytest.FixtureRequest
) -> Any:
    """A Spark session on `tailguard_cluster`, every worker's executor registered."""
    return _usage(tailguard_harness.spark_of, request.node)


@pytest.fixture
def tailguard_local_spark(tailguard_harness: Harness, request: pytest.FixtureRequest) -> Any:
    """A Spark session on the local master (`local[2]`: one host, two slots)."""
    return _usage(tailguard_harness.local_spark_of, request.node)


@pytest.fixture
def tailguard_services(
    tailguard_harness: Harness, tailguard_broker: Broker, request: pytest.FixtureRequest
) -> Services:
    """The services the `tailguard_services` marker asks for, running on the broker; pass it
    to `run_job(..., services=)`."""
    return _usage(tailguard_harness.services_of, request.node)  # type: ignore[no-any-return]


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    reaped = config.stash.get(REAPED, [])
    if reaped:
        terminalreporter.write_sep("-", "tailguard harness: left running by killed sessions")
        for line in reaped:
            terminalreporter.write_line(f"stopped {line}")
    harness = config.stash.get(HARNESS, None)
    if harness is None or not harness.costs:
        return
    terminalreporter.write_sep("-", "tailguard harness: what it started")
    for cost in harness.costs:
        terminalreporter.write_line(f"{cost.seconds:6.1f} s  {cost.what}")
    total = sum(c.seconds for c in harness.costs)
    terminalreporter.write_line(f"{total:6.1f} s  in all ({len(harness.costs)} starts)")
