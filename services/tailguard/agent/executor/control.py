"""Cooperative cancellation and progress for the attempt running in this slot runner.

The runner gives each attempt an `AttemptControl`. The attempt's own code (reading inputs,
running the chain, writing outputs) checks it between record batches, and a user operator can
use `wait` and `check_cancelled` for long waits or loops: cancellation is then a flag that the
attempt notices, not a killed process, so its slot is free again at once. An attempt that does
not notice within the runner's grace period has its worker process ended instead.
"""

from __future__ import annotations

import contextvars
import threading
import time


class AttemptCancelled(Exception):
    """Raised inside an attempt that was asked to stop."""


class AttemptControl:
    """The cancel flag and the read counters of one attempt (shared by two threads: the
    attempt's, which counts and checks, and the runner's, which cancels and reports)."""

    def __init__(self, bytes_total: int | None = None) -> None:
        self._cancel = threading.Event()
        self.records_read = 0
        self.bytes_read = 0
        self.bytes_total = bytes_total

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def check(self) -> None:
        if self._cancel.is_set():
            raise AttemptCancelled("the attempt was cancelled")

    def wait(self, seconds: float) -> None:
        """Sleep, but end at once with `AttemptCancelled` when the attempt is cancelled."""
        if self._cancel.wait(max(0.0, seconds)):
            raise AttemptCancelled("the attempt was cancelled")

    def read(self, records: int, nbytes: int) -> None:
        # Plain int updates: the reporting thread reads a value at most one batch old.
        self.records_read += records
        self.bytes_read += nbytes


_CURRENT: contextvars.ContextVar[AttemptControl | None] = contextvars.ContextVar(
    "tailguard_attempt", default=None
)


def current() -> AttemptControl | None:
    """The control of the attempt running in this thread, or None outside an attempt."""
    return _CURRENT.get()


def bind(control: AttemptControl | None) -> contextvars.Token[AttemptControl | None]:
    return _CURRENT.set(control)


def unbind(token: contextvars.Token[AttemptControl | None]) -> None:
    _CURRENT.reset(token)


def wait(seconds: float) -> None:
    """For operators: a wait that a cancellation interrupts (a plain sleep outside attempts)."""
    control = current()
    if control is None:
        time.sleep(seconds)
    else:
        control.wait(seconds)


def check_cancelled() -> None:
    """For operators with long loops: raise `AttemptCancelled` if the attempt was cancelled."""
    control = current()
    if control is not None:
        control.check()
