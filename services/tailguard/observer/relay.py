"""`python -m tailguard.observer.relay`: the listener's lines in on stdin, tailguard events out.

The JVM listener starts this process and writes to its stdin: first the settings (`C key
value`, never on the command line where other users of the host could read a secret), then the
application (`A`), then Spark's events. The relay translates them (`translate.py`), publishes
each job's events to Kafka and the application's archive, and gives each running job a `Tick`
every `slow-task-detector.check-interval`, the detector's clock. It ends at the application's
end line or when the pipe closes (the driver is gone), after the services' last decisions about
the jobs have reached the archive.

Attach mode (`tailguard.attach`, docs/attach.md): when the listener has an actuator it says so
(`ACT`, before the application line), and the relay then also acts. The services' commands about
the application's jobs come back through the publisher's consumer, are checked and turned into
actions (`observer/actuation.py`) on this thread, and written to the relay's standard output, which
the JVM reads; its answers come back among the events (`CO`, `AV`). The relay's own output
(logging, stray prints) goes to standard error, so nothing but actions reaches that pipe.

Ticks are stamped `TICK_HOLDBACK_MS` behind the relay's clock: Spark's listener bus delivers an
event a little after its timestamp, and a Tick stamped later than an attempt's unreported end
would judge that attempt as still running. The relay runs on the driver's host, so its clock is
the one Spark stamps events with.
"""

from __future__ import annotations

import logging
import os
import queue
import resource
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any

from tailguard.model import records as r
from tailguard.model.authority import Origin
from tailguard.model.config import SERVICES_KEY, Settings, parse_flag, recorded_config
from tailguard.model.fleet import FleetBlock
from tailguard.observer.translate import ObserveError, SparkEventTranslator

log = logging.getLogger("tailguard.observer")

TICK_HOLDBACK_MS = 250
LOG_MODE_KEY = "tailguard.observe.log-mode"  # kafka (default) | archive
ATTACH_KEY = "tailguard.attach.enabled"  # with an actuator: act (default) or only observe
# Lines the JVM writes for the relay itself, not Spark events: the actuator is there (ACT), a
# command kind it lacks (AV), a command's outcome (CO).
_ACTUATOR_LINES = ("ACT", "AV", "CO")


@dataclass(frozen=True)
class _Received:
    """A command from the services, with what its signature said (from the consumer thread)."""

    command: r.Command
    origin: Origin


@dataclass(frozen=True)
class _FleetList:
    """The fleet blocklist's changes, as just read (from the fleet reader's thread)."""

    changes: list[FleetBlock]


def _lines(stream: IO[bytes]) -> Iterator[list[str]]:
    for raw in stream:
        line = raw.decode("utf-8", "replace").rstrip("\n")
        if line:
            yield line.split("\t")


_Item = list[str] | _Received | _FleetList | None


def _reader(lines: Iterable[list[str]], into: queue.Queue[_Item]) -> None:
    for fields in lines:
        into.put(fields)
    into.put(None)


def relay(
    stream: IO[bytes],
    environ_settings: Settings | None = None,
    actions: IO[bytes] | None = None,
) -> int:
    """Relay one application's lines from `stream`; the exit status. `actions` is where attach
    mode writes the actuator's action lines (the JVM reads the relay's standard output)."""
    from tailguard.observer.publisher import publisher_for
    from tailguard.settings_file import load_settings

    lines = _lines(stream)
    config: dict[str, str] = {}
    actuator = False
    app: list[str] | None = None
    # Spark posts the driver's ExecutorAdded before ApplicationStart: lines that come before the
    # application are kept and translated right after it.
    early: list[list[str]] = []
    for fields in lines:
        if fields[0] == "C" and len(fields) == 3:
            config[fields[1]] = fields[2]
        elif fields[0] == "ACT":
            actuator = True
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
    if mode == "kafka" and (problem := _broker_problem(settings)) is not None:
        # One warning, then the application runs as if unattached: its events still go to the
        # archive, and nothing waits for a broker.
        log.warning(
            "observe: %s; application %s runs as if unattached (its events: the archive only)",
            problem,
            translator.app_id,
        )
        mode, actuator = "archive", False
    pending: queue.Queue[_Item] = queue.Queue()
    actuation = None
    if actuator and actions is not None and _attach_wanted(settings, mode):
        from tailguard.observer.actuation import Actuation

        actuation = Actuation(translator, settings, actions)
        actuation.probe()
    publisher = publisher_for(
        settings,
        translator.app_id,
        kafka=mode == "kafka",
        on_command=(lambda c, o: pending.put(_Received(c, o))) if actuation else None,
        start_at_ms=int(app[1]),  # the attachment's time, as the listener stamped it
    )
    log.info(
        "observe: application %s (%s) -> %s",
        translator.app_id,
        translator.app_name,
        publisher.archive_path,
    )
    interval_ms = settings.duration_ms("slow-task-detector.check-interval")
    # The relay ends when the listener closes the pipe (after its end line, or with the JVM):
    # the reader thread has then finished, and no thread is left blocked on stdin.
    reader = threading.Thread(
        target=_reader, args=(lines, pending), name="tg-observe-in", daemon=True
    )
    reader.start()
    stop_fleet = threading.Event()
    if actuation is not None:
        threading.Thread(
            target=_read_fleet,
            args=(settings, pending, stop_fleet),
            name="tg-attach-fleet",
            daemon=True,
        ).start()
    bad = 0

    def now() -> int:
        return int(time.time() * 1000)

    def feed(item: list[str] | _Received | _FleetList) -> None:
        nonlocal bad
        try:
            for event in _events(item):
                publisher.publish(event)
        except ObserveError as exc:  # one bad line never stops the application's observation
            bad += 1
            log.error("observe: %s", exc)

    def _events(item: list[str] | _Received | _FleetList) -> list[r.Event]:
        if isinstance(item, _Received):
            return actuation.received(item.command, item.origin, now()) if actuation else []
        if isinstance(item, _FleetList):
            if actuation is not None:
                actuation.fleet(item.changes, now())
            return []
        if item[0] in _ACTUATOR_LINES:
            if actuation is None:
                return []
            if item[0] == "AV":
                actuation.available(item)
            elif item[0] == "CO":
                return actuation.outcome(item, now())
            return []
        events = translator.handle(item)
        if actuation is not None:
            for event in list(events):
                if isinstance(event, r.JobSubmitted):
                    events += actuation.job_started(event.job_id, event.ts)
            if item[0] == "X":  # a host may have joined: is it on the fleet list?
                actuation.fleet(None, now())
        return events

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
                for tick in translator.tick(now() - TICK_HOLDBACK_MS):
                    publisher.publish(tick)
                for lifted in actuation.tick(now()) if actuation else []:
                    publisher.publish(lifted)
                next_tick = time.monotonic() + interval_ms / 1000.0
    finally:
        stop_fleet.set()
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
    if actuation is not None:
        log.info(
            "attach: application %s: %d commands applied, %d rejected",
            translator.app_id,
            actuation.applied,
            actuation.rejected,
        )
        _write_summary(publisher.archive_path, actuation)
    return 0


def _write_summary(archive: str, actuation: Any) -> None:
    """`<archive>.attach.json` beside a local archive: the commands' outcomes and how long each
    took from reaching the relay to Spark's answer (`make bench-attach` reads it)."""
    import json
    from pathlib import Path

    if "://" in archive and not archive.startswith("file://"):
        return  # an object store: the archive itself is the record
    path = Path(archive.removeprefix("file://") + ".attach.json")
    summary = {
        "applied": actuation.applied,
        "rejected": actuation.rejected,
        "relay_to_outcome_ms": [round(ms, 3) for ms in actuation.outcome_ms],
    }
    try:
        path.write_text(json.dumps(summary))
    except OSError as err:
        log.warning("attach: no summary at %s: %s", path, err)


BROKER_PROBE_S = 5.0


def _broker_problem(settings: Settings) -> str | None:
    """Why no broker can take the application's events (None: one answered)."""
    from confluent_kafka import KafkaException, Producer

    from tailguard.kafka.config import client_config

    # librdkafka would log every reconnect attempt; the one warning above says it all.
    client = Producer(client_config(settings, "producer", {"log_level": 0}))
    try:
        client.list_topics(timeout=BROKER_PROBE_S)
    except KafkaException as err:
        return f"no broker answered within {BROKER_PROBE_S:g} s ({err.args[0].str()})"
    return None


def _read_fleet(settings: Settings, into: queue.Queue[_Item], stop: threading.Event) -> None:
    """The fleet list, read now and every `FLEET_REFRESH_S` until `stop`."""
    from tailguard.blocklist.fleet_topic import read_changes
    from tailguard.observer.actuation import FLEET_REFRESH_S

    warned = False
    while not stop.is_set():
        try:
            into.put(_FleetList(read_changes(settings)))
        except Exception as err:  # the list helps; the application must not miss it loudly
            if not warned:
                log.warning("attach: the fleet blocklist cannot be read: %s", err)
                warned = True
        stop.wait(FLEET_REFRESH_S)


def _attach_wanted(settings: Settings, mode: str) -> bool:
    raw = settings.get(ATTACH_KEY) or "true"
    wanted = parse_flag(raw)
    if wanted is None:
        # Acting on a value nobody can read would surprise the user either way; the application
        # must not fail for it, so observe and say why.
        log.warning("attach: %s=%r is not a boolean: observing only", ATTACH_KEY, raw)
        return False
    if not wanted:
        log.info("attach: %s is off: observing only", ATTACH_KEY)
        return False
    if mode != "kafka":
        log.warning("attach: %s=%s has no services to decide: observing only", LOG_MODE_KEY, mode)
        return False
    return True


def main() -> int:
    # Standard output is the actuator's channel (attach mode): keep it for action lines, and
    # send everything else written to fd 1 (a library's print) to standard error.
    actions = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr
    )
    return relay(sys.stdin.buffer, actions=actions)


if __name__ == "__main__":
    sys.exit(main())
