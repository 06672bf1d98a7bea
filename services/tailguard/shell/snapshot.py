"""Bounded restart: a service's state kept as the input records that still matter.

A core's state is a fold of its input. Most of that input stops mattering: a finished job's state
is dropped by the core itself (the detector, decider and failover delete a job at `JobFinished`),
and the findings readers keep only their most recently active jobs. So the snapshot holds the
*retained input* - the records of the jobs the core still holds, with their partition and offset -
and a restart folds those records into a fresh core, then the topic's tail after the snapshot.

Why input and not the cores' own state: the state is then the same fold the live service and
replay compute, so it is exact by construction (no second representation of five cores' internals
to keep in step with every policy change, no schema per core to version), and the encoding is the
records' own versioned Avro. The price is a restart proportional to the live jobs' input rather
than to their state (measured in docs/reliability.md#bounded-restart).

What to retain is each service's rule (`Service.retention`, tailguard.system.retention),
a pure function of the input order:

- `UntilJobFinished`: a job's records until its `JobFinished` (events readers);
- `RecentJobs(n)`: the records of the n most recently active jobs (the speculator's own LRU rule);
- `EveryRecord`: everything (a core whose forgetting the shell cannot mirror exactly);
- `CoreState`: no input but one row holding the core's own state (the blocklist, whose state no
  bounded part of its input rebuilds: tailguard.system.retention says why).

The snapshot file is an Avro container (fastavro): one `RetainedRecord` per record, the positions
(next offset per partition, and a digest of the last record read there, which tells a snapshot of
another log - an embedded broker restarted empty - from this one) in the header's metadata.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import fastavro

from tailguard.system.retention import STATE_PARTITION, Retained

# Bumped on any change of the file's meaning; a snapshot of another version is ignored (the
# service then rebuilds from the topic, which is slower but exact).
SNAPSHOT_VERSION = 1

RETAINED_RECORD_SCHEMA = fastavro.parse_schema(
    {
        "type": "record",
        "name": "RetainedRecord",
        "namespace": "tailguard.shell.snapshot",
        "doc": "One input record a service's core still depends on, as read from its topic.",
        "fields": [
            {"name": "partition", "type": "int"},
            {"name": "offset", "type": "long"},
            {"name": "value", "type": "bytes"},
        ],
    }
)

_META = "tailguard.snapshot"

log = logging.getLogger("tailguard.service")


class SnapshotError(ValueError):
    """A snapshot file that cannot be used; the message names the file and the problem."""


def digest(value: bytes | None) -> str:
    return hashlib.sha256(value or b"").hexdigest()[:32]


@dataclass(frozen=True)
class Position:
    """Where the snapshot stops on one partition: the next offset, and the last record's digest."""

    next_offset: int
    last_digest: str


@dataclass(frozen=True)
class Snapshot:
    service: str
    topic: str
    positions: dict[int, Position]
    records: tuple[Retained, ...]


class SnapshotStore:
    """One service's snapshot file, replaced atomically (write aside, fsync, rename)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, snapshot: Snapshot) -> int:
        """Write it; returns the file's size in bytes."""
        meta = {
            "version": SNAPSHOT_VERSION,
            "service": snapshot.service,
            "topic": snapshot.topic,
            "positions": {
                str(p): [pos.next_offset, pos.last_digest]
                for p, pos in sorted(snapshot.positions.items())
            },
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        aside = self.path.with_name(self.path.name + ".tmp")
        with aside.open("wb") as out:
            fastavro.writer(
                out,
                RETAINED_RECORD_SCHEMA,
                _rows(sorted(snapshot.records)),
                metadata={_META: json.dumps(meta)},
                # Encoded Avro records compress well (repeated names, ids); zlib is in every
                # Python, and deflate costs ~1 s per 100 MB of input here.
                codec="deflate",
            )
            out.flush()
            os.fsync(out.fileno())
        aside.replace(self.path)
        return self.path.stat().st_size

    def read(self, service: str, topic: str) -> Snapshot | None:
        """The snapshot, None if there is none; SnapshotError if it is another service's or
        version's, or unreadable."""
        try:
            source = self.path.open("rb")
        except FileNotFoundError:
            return None
        with source:
            try:
                reader = fastavro.reader(source)
                meta = json.loads(reader.metadata[_META])
                if meta.get("version") != SNAPSHOT_VERSION:
                    raise SnapshotError(
                        f"{self.path}: snapshot version {meta.get('version')!r}, this "
                        f"release reads version {SNAPSHOT_VERSION}"
                    )
                if (meta["service"], meta["topic"]) != (service, topic):
                    raise SnapshotError(
                        f"{self.path}: a snapshot of {meta['service']} on {meta['topic']}, "
                        f"not of {service} on {topic}"
                    )
                positions = {
                    int(p): Position(int(at), str(last))
                    for p, (at, last) in meta["positions"].items()
                }
                records = tuple(_retained(row) for row in reader)
            except SnapshotError:
                raise
            except (ValueError, KeyError, TypeError, EOFError, OSError) as err:
                raise SnapshotError(f"{self.path}: not a readable snapshot: {err}") from err
        return Snapshot(service, topic, positions, records)


def _retained(row: object) -> Retained:
    if not isinstance(row, dict):
        raise ValueError(f"a snapshot row is a record, not {type(row).__name__}")
    return Retained(int(row["partition"]), int(row["offset"]), bytes(row["value"]))


def _rows(records: Iterable[Retained]) -> Iterator[dict[str, object]]:
    for r in records:
        yield {"partition": r.partition, "offset": r.offset, "value": r.value}


def carried_over(
    snapshot: Snapshot, on_new_log: Callable[[Retained], bool] = lambda _: False
) -> Snapshot:
    """The same state for a new log of the topic (an embedded broker restarted empty numbers it
    from 0 again): no positions (read the new log from its start), and the records renumbered
    below 0 in their order, so they stay before every record of the new log.

    `on_new_log` names the retained records read from the new log already (the service went on
    reading after the broker came back, until its group's loss stopped it): they are left out,
    because the new log is read again from its start, and their offsets, numbered from 0 again,
    would sort them among the old log's records."""
    # A core's own state (retention.CoreState) is no record of the log: kept as it is.
    state = tuple(r for r in snapshot.records if r.partition == STATE_PARTITION)
    records = sorted(
        r for r in snapshot.records if r.partition != STATE_PARTITION and not on_new_log(r)
    )
    return Snapshot(
        snapshot.service,
        snapshot.topic,
        {},
        state + tuple(Retained(0, i - len(records), r.value) for i, r in enumerate(records)),
    )


class PeriodicSnapshots:
    """Takes a snapshot every `every_records` inputs or `every_s` seconds (whichever first) and
    writes it in a thread of its own, so the stream waits only for the capture (a copy of the
    retained list), not for the file. `after_input` is called between two inputs (or two batches of
    them: shell.answering), once the previous input's outputs are acknowledged: a snapshot never
    covers an unanswered input.

    The bound on a restart is the retained input plus at most this much tail."""

    def __init__(
        self,
        store: SnapshotStore,
        take: Callable[[], Snapshot],
        every_records: int = 50_000,
        every_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self._take = take
        self._every_records = every_records
        self._every_s = every_s
        self._clock = clock
        self._since = 0
        self._last = clock()
        self._writer: threading.Thread | None = None
        self.written = 0  # snapshots written
        self.last_size = 0  # bytes of the last one
        self._answering = False  # an input handed to the core whose outputs are not yet acked

    def before_input(self) -> None:
        self._answering = True

    def after_input(self, inputs: int = 1) -> None:
        """`inputs` answered since `before_input` (a batch's)."""
        self._answering = False
        self._since += inputs
        due = self._since >= self._every_records or self._clock() - self._last >= self._every_s
        if due and (self._writer is None or not self._writer.is_alive()):
            self.take_now()

    def take_now(self) -> None:
        snapshot = self._take()
        self._since, self._last = 0, self._clock()
        self._writer = threading.Thread(
            target=self._write, args=(snapshot,), name="snapshot-writer", daemon=True
        )
        self._writer.start()

    def _write(self, snapshot: Snapshot) -> None:
        started = self._clock()
        try:
            self.last_size = self.store.write(snapshot)
            self.written += 1
            # With the time it took: the writer shares the process (and the GIL) with the stream.
            log.info(
                "snapshot of %s written: %d records, %d bytes in %.2f s",
                snapshot.service, len(snapshot.records), self.last_size, self._clock() - started,
            )  # fmt: skip
        except OSError as err:
            # The previous snapshot stays in place: a later restart reads a longer tail.
            service, path = snapshot.service, self.store.path
            log.error("snapshot of %s not written to %s: %s", service, path, err)

    @property
    def answering(self) -> bool:
        return self._answering

    def close(self) -> None:
        """At a clean stop: a last snapshot (so the next start reads no tail), unless the stream
        stopped while answering an input."""
        if self._writer is not None:
            self._writer.join()
        if self._since and not self._answering:
            self.take_now()
        if self._writer is not None:
            self._writer.join()
