"""The services' decisions read back on a thread of its own, and how far before a job's first
fact the reading starts. The owned driver's publisher (`agent/adapters/kafka.py`) and observe
mode's (`observer/publisher.py`) share it, so it sits in the log layer below both.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from tailguard.kafka.consumer import Consumed, RecordConsumer
from tailguard.model.config import Settings, parse_duration_ms

log = logging.getLogger(__name__)

# How long the job's end waits for the decision reader to stop (each of its broker lookups
# gives up after 5 s while no broker answers).
READER_STOP_S = 15.0


START_MARGIN = "tailguard.agent.start-margin"
DEFAULT_START_MARGIN = "60 s"


def start_margin_ms(settings: Settings) -> int:
    """How far before a job's (or an observed application's) first fact its decision reader
    starts: the most the services' hosts' clocks may lag the driver's (docs/log.md)."""
    return parse_duration_ms(settings.get(START_MARGIN) or DEFAULT_START_MARGIN)


class DecisionReader:
    """What the services send back, read on a thread of its own: each record goes to `take`,
    which archives (or delivers) it and says whether it was about the publisher's jobs;
    `drain` waits until those have gone quiet. Should the thread die, `on_failure` gets the
    exception. The agent's publisher and the observer's share it."""

    def __init__(
        self,
        consumer: RecordConsumer,
        take: Callable[[Consumed], bool],
        *,
        label: str,
        thread_name: str,
        on_failure: Callable[[BaseException], None] | None = None,
        drain_quiet_ms: int = 750,
        drain_max_ms: int = 5000,
    ) -> None:
        self.consumer = consumer
        self._take = take
        self._label = label
        self._on_failure = on_failure
        self._drain_quiet_ms = drain_quiet_ms
        self._drain_max_ms = drain_max_ms
        self._last_seen = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for item in self.consumer.poll(0.1):
                    if self._take(item):
                        self._last_seen = time.monotonic()
        except BaseException as err:  # the job must not go on without its decisions, unseen
            log.exception("%s: the decision reader died", self._label)
            if self._on_failure is not None:
                self._on_failure(err)

    def drain(self) -> None:
        """Wait until nothing about the publisher's jobs came for `drain_quiet_ms` (at most
        `drain_max_ms`), so the decisions about their last events reach the archive."""
        started = time.monotonic()
        while (time.monotonic() - started) * 1000 < self._drain_max_ms:
            quiet_ms = (time.monotonic() - self._last_seen) * 1000
            if quiet_ms >= self._drain_quiet_ms or not self._thread.is_alive():
                break
            self._stop.wait(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=READER_STOP_S)
        if self._thread.is_alive():  # still inside a broker call: closing under it would crash
            log.warning("%s: the decision reader did not stop; left to exit", self._label)
            return
        self.consumer.close()
