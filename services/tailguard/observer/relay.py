"""`python -m tailguard.observer.relay`: the listener's lines in on stdin, tailguard events out.

The JVM listener starts this process and writes to its stdin: first the settings (`C key
value`, never on the command line where other users of the host could read a secret), then the
application (`A`), then Spark's events. The relay translates them (`translate.py`), publishes
each job's events to Kafka and the application's archive, and gives each running job a `Tick`
every `slow-task-detector.check-interval`, the detector's clock. It ends at the application's
end line or when the pipe closes (the driver is gone), after the services' last decisions about
the jobs have reached the archive.

Ticks are stamped `TICK_HOLDBACK_MS` behind the relay's clock: Spark's listener bus delivers an
event a little after its timestamp, and a Tick stamped later than an attempt's unreported end
would judge that attempt as still running. The relay runs on the driver's host, so its clock is
the one Spark stamps events with.
"""

from __future__ import annotations

import logging
import queue
import resource
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import IO

from tailguard.model.config import SERVICES_KEY, Settings, recorded_config
from tailguard.observer.translate import ObserveError, SparkEventTranslator

log = logging.getLogger("tailguard.observer")

TICK_HOLDBACK_MS = 250
LOG_MODE_KEY = "tailguard.observe.log-mode"  # kafka (default) | archive


def _lines(stream: IO[bytes]) -> Iterator[list[str]]:
    for raw in stream:
        line = raw.decode("utf-8", "replace").rstrip("\n")
        if line:
            yield line.split("\t")


def _reader(lines: Iterable[list[str]], into: queue.Queue[list[str] | None]) -> None:
    for fields in lines:
        into.put(fields)
    into.put(None)


def relay(stream: IO[bytes], environ_settings: Settings | None = None) -> int:
    """Relay one application's lines from `stream`; the exit status."""
    from tailguard.observer.publisher import publisher_for
    from tailguard.settings_file import load_settings

    lines = _lines(stream)
    config: dict[str, str] = {}
    app: list[str] | None = None
    # Spark posts the driver's ExecutorAdded before ApplicationStart: lines that come before the
    # application are kept and translated right after it.
    early: list[list[str]] = []
    for fields in lines:
        if fields[0] == "C" and len(fields) == 3:
            config[fields[1]] = fields[2]
        elif fields[0] == "A":
            app = fields
            break
        else:
            early.append(fields)
    if app is None:
        return 0  # the application ended before it started: nothing to publish
    settings = (environ_settings or load_settings()).merged(config)
    recorded = recorded_config({**settings.overrides(), SERVICES_KEY: "on"})
    translator = SparkEventTranslator(recorded)
    translator.handle(app)
    mode = settings.get(LOG_MODE_KEY) or "kafka"
    if mode not in ("kafka", "archive"):
        log.error("observe: %s must be kafka or archive, not %r", LOG_MODE_KEY, mode)
        return 2
    publisher = publisher_for(settings, translator.app_id, kafka=mode == "kafka")
    log.info(
        "observe: application %s (%s) -> %s",
        translator.app_id,
        translator.app_name,
        publisher.archive_path,
    )
    interval_ms = settings.duration_ms("slow-task-detector.check-interval")
    pending: queue.Queue[list[str] | None] = queue.Queue()
    # The relay ends when the listener closes the pipe (after its end line, or with the JVM):
    # the reader thread has then finished, and no thread is left blocked on stdin.
    reader = threading.Thread(
        target=_reader, args=(lines, pending), name="tg-observe-in", daemon=True
    )
    reader.start()
    bad = 0

    def feed(fields: list[str]) -> None:
        nonlocal bad
        try:
            for event in translator.handle(fields):
                publisher.publish(event)
        except ObserveError as exc:  # one bad line never stops the application's observation
            bad += 1
            log.error("observe: %s", exc)

    next_tick = time.monotonic()
    try:
        for fields in early:
            feed(fields)
        while True:
            try:
                item = pending.get(timeout=max(0.0, next_tick - time.monotonic()))
            except queue.Empty:
                item = []
            if item is None:
                break
            if item:
                feed(item)
            if time.monotonic() >= next_tick:
                for tick in translator.tick(int(time.time() * 1000) - TICK_HOLDBACK_MS):
                    publisher.publish(tick)
                next_tick = time.monotonic() + interval_ms / 1000.0
    finally:
        publisher.close()
    reader.join()
    # What observing cost the machine: the relay's own CPU (start-up included), for the
    # overhead benchmark to set beside the application's.
    usage = resource.getrusage(resource.RUSAGE_SELF)
    log.info(
        "observe: application %s: %d lines, %d ignored, %d malformed; relay CPU %.3f s",
        translator.app_id,
        translator.lines,
        translator.ignored,
        bad,
        usage.ru_utime + usage.ru_stime,
    )
    return 0


def main() -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr
    )
    return relay(sys.stdin.buffer)


if __name__ == "__main__":
    sys.exit(main())
