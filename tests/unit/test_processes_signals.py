"""stop_on_signals: Ctrl-C and SIGTERM set the event, even in a process that inherited SIGINT
ignored (a job a shell starts with `&`), where Python's default would never raise."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from tailguard.processes.signals import stop_on_signals


@pytest.fixture
def restored_handlers() -> Iterator[None]:
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
@pytest.mark.usefixtures("restored_handlers")
def test_either_signal_sets_the_event_even_with_sigint_ignored_before(signum: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as inherited from a shell's `&`
    stop = stop_on_signals()
    assert not stop.is_set()
    os.kill(os.getpid(), signum)
    assert stop.wait(timeout=10)
