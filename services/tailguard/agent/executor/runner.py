"""The slot runner: one long-lived Spark task per executor core (Flink's TaskExecutor slot).

It connects back to the driver, says hello, and then runs the attempts the driver deploys to it,
one at a time, each in a thread of its own so the runner keeps listening: a `Cancel` sets the
attempt's flag, and progress goes back at least every progress interval. The outcome goes back
over the same connection. The runner ends when the driver says `Shutdown` or goes away.

An attempt that ignores its cancellation for longer than the grace period takes its worker
process with it (`os._exit`): Spark then sees the task fail, the driver sees the connection
close, and it starts a replacement runner on the same executor.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection
from typing import Any

from tailguard import filesystems
from tailguard.agent.executor.attempt import (
    AttemptKey,
    AttemptOutcome,
    TaskSpec,
    execute,
    recurs_anywhere,
    task_host,
)
from tailguard.agent.executor.control import AttemptControl
from tailguard.agent.executor.environment import tailguard_build
from tailguard.agent.executor.protocol import (
    AttemptEnded,
    AttemptProgressed,
    AttemptStarted,
    Cancel,
    ConfigureStorage,
    Deploy,
    RunnerHello,
    RunnerMessage,
    Shutdown,
    no_delay,
    receive,
    send,
)
from tailguard.model.records import ErrorKind

log = logging.getLogger("tailguard.runner")

# Exit status of a worker process ended because its attempt ignored a cancellation.
CANCEL_EXIT_CODE = 75


@dataclass(frozen=True)
class RunnerConfig:
    """What a runner needs to find and prove itself to its driver (shipped in the Spark task;
    never logged or published: `secret` is the job's runner key)."""

    address: tuple[str, int]
    secret: bytes
    runner_id: str
    host: str
    version: str  # the driver's tailguard build
    progress_interval_s: float = 1.0
    cancel_grace_s: float = 5.0

    def __repr__(self) -> str:  # keep the secret out of any traceback or log line
        return f"RunnerConfig(runner_id={self.runner_id!r}, host={self.host!r})"


# An unchanged report is repeated once this share of the interval has passed since the last
# one: the loop wakes about every interval (a message may wake it sooner), so a threshold of a
# whole interval would skip every other wake-up by a few microseconds.
REPEAT_AFTER = 0.75


def _still_reading(control: AttemptControl, since_last_s: float, interval_s: float) -> bool:
    """Whether an unchanged report is due: the attempt has read some of its input and not all
    of it, and an interval has passed. Its reads then stall, which is news: the detector's
    slow-host rule reads an attempt's time per byte at its last report and judges it after
    `min-reports` reports, so an attempt on a slow disk that reported only when a batch arrived
    was judged after three slow batches (5 s of issue 24's 5x node, where its peers read a batch
    in 0.3 s), and its time per byte was taken at its last read, not now. Nothing is repeated
    before the first byte (a worker still starting is not measured) nor once all is read (the
    rule bounds such an attempt from its deploying time): the extra reports are only those of
    attempts still reading."""
    read = control.bytes_read
    total = control.bytes_total
    return (
        read > 0 and (total is None or read < total) and since_last_s >= interval_s * REPEAT_AFTER
    )


def until_next_report(elapsed_s: float, interval_s: float) -> float:
    """How long the loop sleeps to wake at the attempt's next report time, `interval_s` apart
    from its receipt on. A fixed grid, not an interval after each wake-up: those drifted by the
    loop's own work (pickling a report, a busy core), about 4 ms a report at a load of 9, and
    the slow-host verdict, taken at an attempt's third report, came 3.05 intervals after its
    first instead of 3 (docs/benchmarks.md). A wake-up late by more than an interval skips to
    the next grid point instead of catching up in a burst."""
    return interval_s - elapsed_s % interval_s


class _Running:
    """The attempt this runner is executing."""

    def __init__(self, spec: TaskSpec) -> None:
        self.spec = spec
        self.control = AttemptControl(spec.input_bytes)
        self.received = time.perf_counter()
        self.cancel_deadline: float | None = None
        self.last_report: tuple[int, int] = (-1, -1)
        self.last_sent = 0.0  # perf_counter of the last progress report
        self.thread: threading.Thread | None = None


class SlotRunner:
    def __init__(self, config: RunnerConfig, conn: Connection) -> None:
        self.config = config
        self.conn = conn
        self._send_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._running: _Running | None = None
        self._interval = max(0.01, config.progress_interval_s)

    def _send(self, message: RunnerMessage) -> None:
        with self._send_lock:
            send(self.conn, message)

    # ------------------------------------------------------------------ the loop

    def serve(self) -> str:
        """Run until told to stop; returns why it stopped."""
        self._send(
            RunnerHello(
                runner_id=self.config.runner_id,
                host=self.config.host,
                actual_host=task_host(),
                pid=os.getpid(),
                # Its own build, not the driver's: the driver refuses a runner whose tailguard
                # differs from its own (see `environment`).
                version=tailguard_build(),
            )
        )
        interval = self._interval
        while True:
            self._watch_running()
            try:
                if not self.conn.poll(self._poll_timeout(interval)):
                    continue
                message = receive(self.conn)
            except (EOFError, OSError):
                self._abandon()
                return "the driver closed the connection"
            if isinstance(message, Deploy):
                self._deploy(message)
            elif isinstance(message, Cancel):
                self._cancel(message.key)
            elif isinstance(message, ConfigureStorage):
                filesystems.configure(message.s3)
            elif isinstance(message, Shutdown):
                self._abandon()
                return f"shut down by the driver{': ' + message.reason if message.reason else ''}"

    def _poll_timeout(self, interval: float) -> float:
        with self._state_lock:
            running = self._running
        if running is None:
            return interval
        now = time.perf_counter()
        if running.cancel_deadline is not None:
            return max(0.0, min(interval, running.cancel_deadline - now))
        return until_next_report(now - running.received, interval)

    def _watch_running(self) -> None:
        """Progress of the running attempt, and the end of a cancellation's grace period."""
        with self._state_lock:
            running = self._running
        if running is None:
            return
        if running.cancel_deadline is not None and time.perf_counter() >= running.cancel_deadline:
            # The attempt ignored its cancellation: end the worker process; the driver starts a
            # replacement runner once Spark reports this task gone.
            log.warning("%s ignored its cancellation: ending this worker", running.spec.key)
            os._exit(CANCEL_EXIT_CODE)
        control = running.control
        report = (control.records_read, control.bytes_read)
        now = time.perf_counter()
        if running.cancel_deadline is None and (
            report != running.last_report
            or _still_reading(control, now - running.last_sent, self._interval)
        ):
            running.last_report, running.last_sent = report, now
            self._send(
                AttemptProgressed(running.spec.key, report[0], report[1], control.bytes_total)
            )

    # ------------------------------------------------------------------ attempts

    def _refuse(
        self, key: AttemptKey, kind: ErrorKind, message: str, non_recoverable: bool = False
    ) -> None:
        now = int(time.time() * 1000)
        outcome = AttemptOutcome(
            ok=False,
            host=task_host(),
            started_at_ms=now,
            finished_at_ms=now,
            error=kind,
            message=message[:2000],
            non_recoverable=non_recoverable,
        )
        self._send(AttemptEnded(key, outcome, 0.0))

    def _deploy(self, message: Deploy) -> None:
        try:
            spec = message.spec()
        except Exception as err:  # the chain's code cannot be loaded here: the user's to fix
            detail = "".join(traceback.format_exception_only(type(err), err)).strip()
            self._refuse(
                message.key,
                ErrorKind.USER,
                f"cannot load the attempt: {detail}",
                recurs_anywhere(err),
            )
            return
        with self._state_lock:
            busy = self._running
            if busy is None:
                running = _Running(spec)
                self._running = running
        if busy is not None:
            # The driver never does this; answer it rather than run two attempts in one slot.
            self._refuse(
                spec.key,
                ErrorKind.INFRA,
                f"runner {self.config.runner_id} is busy with {busy.spec.key}",
            )
            return
        running.thread = threading.Thread(
            target=self._execute, args=(running,), name=f"tg-attempt-{spec.key}", daemon=True
        )
        running.thread.start()

    def _execute(self, running: _Running) -> None:
        self._send(AttemptStarted(running.spec.key))
        outcome = execute(running.spec, running.control)
        with self._state_lock:
            self._running = None
        run_ms = (time.perf_counter() - running.received) * 1000.0
        # If the driver is gone the loop notices and ends.
        with contextlib.suppress(OSError, ValueError):
            self._send(AttemptEnded(running.spec.key, outcome, run_ms))

    def _cancel(self, key: AttemptKey) -> None:
        with self._state_lock:
            running = self._running
            if running is None or running.spec.key != key:
                return  # already ended: its outcome is on its way
            running.control.cancel()
            if running.cancel_deadline is None:
                running.cancel_deadline = time.perf_counter() + self.config.cancel_grace_s

    def _abandon(self) -> None:
        with self._state_lock:
            running = self._running
        if running is not None:
            running.control.cancel()
            if running.thread is not None:
                running.thread.join(self.config.cancel_grace_s)


def serve(config: RunnerConfig) -> str:
    """Connect to the driver and serve until stopped (the body of a runner's Spark task)."""
    conn = Client(config.address, authkey=config.secret)
    no_delay(conn)
    try:
        return SlotRunner(config, conn).serve()
    finally:
        conn.close()


def run_partition(items: Iterator[Any]) -> Iterator[str]:
    """`mapPartitions` entry: each element is a `RunnerConfig`; yields why the runner ended."""
    for config in items:
        yield serve(config)
