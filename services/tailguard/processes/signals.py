"""How a tailguard process in the foreground learns it should stop: Ctrl-C or SIGTERM.

Both are handled by name, never left to Python's default. A shell starts a job it runs with
`&` with SIGINT ignored, and Python then keeps it ignored, so Ctrl-C's default
(KeyboardInterrupt) would never come for a process started from a script that way.
"""

from __future__ import annotations

import signal
import threading


def stop_on_signals() -> threading.Event:
    """An event that Ctrl-C (SIGINT) and SIGTERM set; call from the main thread."""
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda _signum, _frame: stop.set())
    return stop
