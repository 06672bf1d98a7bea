"""Keeping a service's log readable when its broker is gone.

aiokafka and faust log every failed reconnect (several a second, each with its stack), which was
measured at about 400 KB of log per minute per service while the broker was away (issue 14). The
first line of each kind says what happened; the repeats say nothing new. So a line from those
libraries that repeats one already written (same logger, same message template) within
`interval_s` is dropped, and the next one let through says how many were.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

# The libraries that retry in a loop. tailguard's own lines are never limited: one per record
# is their design (a decision log).
NOISY_LOGGERS = ("aiokafka", "faust", "mode", "kafka")


class RepeatLimiter(logging.Filter):
    def __init__(
        self,
        interval_s: float = 60.0,
        loggers: tuple[str, ...] = NOISY_LOGGERS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self._interval = interval_s
        self._loggers = loggers
        self._clock = clock
        # (logger, template) -> (time it was last let through, lines dropped since)
        self._seen: dict[tuple[str, str], tuple[float, int]] = {}

    def _limited(self, name: str) -> bool:
        return any(name == n or name.startswith(n + ".") for n in self._loggers)

    def filter(self, record: logging.LogRecord) -> bool:
        if not self._limited(record.name):
            return True
        key = (record.name, str(record.msg))
        now = self._clock()
        last = self._seen.get(key)
        if last is not None and now - last[0] < self._interval:
            self._seen[key] = (last[0], last[1] + 1)
            return False
        if last is not None and last[1]:
            dropped, span = last[1], now - last[0]
            record.msg = f"{record.msg} [{dropped} more like this in the last {span:.0f} s]"
        self._seen[key] = (now, 0)
        return True
