"""What a service's snapshot keeps: the input records its core's state still depends on.

Each service names its rule in the table of the services (`tailguard.system.services`); every
rule is a pure function of the input order, so a snapshot is a pure function of the input prefix
it covers (tailguard.shell.snapshot says why the snapshot holds input rather than the cores'
state).

One core is the exception, `CoreState`: the blocklist's state cannot be rebuilt from any bounded
part of its input, so its snapshot holds the state itself.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from tailguard.model.records import JobFinished, Record


@dataclass(frozen=True, order=True)
class Retained:
    partition: int
    offset: int
    value: bytes = field(compare=False)


class Retention(Protocol):
    """Which input records the core's state still depends on."""

    def attach(self, core: object) -> None:
        """The core whose state it keeps (the processor's, once, before any record)."""
        ...

    def keep(self, record: Record, retained: Retained) -> None: ...

    def records(self) -> list[Retained]:
        """A copy, in any order (the snapshot sorts them by partition and offset, the order the
        core read them in: a job's records are on one partition, keyed by job id)."""
        ...

    def load(self, kept: Retained) -> bool:
        """At a restore, take a snapshot row as the core's state if it is one (`CoreState`);
        False: it is an input record, to fold into the core."""
        ...


class _OfInput:
    """A rule that keeps input records: every snapshot row is one, folded at a restore."""

    def attach(self, core: object) -> None:
        """Nothing: what it keeps is input, not the core's state."""

    def load(self, kept: Retained) -> bool:
        return False


class EveryRecord(_OfInput):
    def __init__(self) -> None:
        self._kept: list[Retained] = []

    def keep(self, record: Record, retained: Retained) -> None:
        self._kept.append(retained)

    def records(self) -> list[Retained]:
        return list(self._kept)


class _PerJob(_OfInput):
    def __init__(self) -> None:
        self._jobs: OrderedDict[str, list[Retained]] = OrderedDict()

    def _append(self, job_id: str, retained: Retained) -> None:
        self._jobs.setdefault(job_id, []).append(retained)

    def records(self) -> list[Retained]:
        return [r for kept in self._jobs.values() for r in kept]

    @property
    def jobs(self) -> int:
        return len(self._jobs)


class UntilJobFinished(_PerJob):
    """For cores that delete a job's state at its JobFinished and ignore records of a job they do
    not hold: after JobFinished the job's records change nothing, and a later record of the same
    job id starts it afresh, in the core as here."""

    def keep(self, record: Record, retained: Retained) -> None:
        if isinstance(record, JobFinished):
            self._jobs.pop(record.job_id, None)
        else:
            self._append(record.job_id, retained)


class RecentJobs(_PerJob):
    """For cores that keep the `limit` most recently active jobs (any record makes a job active)
    and forget the least recent beyond that."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        if limit < 1:
            raise ValueError(f"RecentJobs needs a limit of at least 1 job, not {limit}")
        self._limit = limit

    def keep(self, record: Record, retained: Retained) -> None:
        self._append(record.job_id, retained)
        self._jobs.move_to_end(record.job_id)
        while len(self._jobs) > self._limit:
            self._jobs.popitem(last=False)


@runtime_checkable
class StatefulCore(Protocol):
    """A core that writes its whole state and takes one back (`CoreState`)."""

    def export_state(self) -> bytes: ...

    def import_state(self, encoded: bytes) -> None:
        """ValueError naming the problem if `encoded` is not such a state."""
        ...


# The partition of the snapshot row that holds a core's own state: below every partition of a
# topic, so the snapshot (sorted by partition and offset) lists it first.
STATE_PARTITION = -1


class CoreState:
    """For a core whose state no bounded subset of its input rebuilds exactly: the snapshot is one
    row holding the core's state (`StatefulCore.export_state`), and no input.

    The blocklist's fleet is that core. A fleet block is extended only once the extension
    reaches half the block duration, so its expiry is a chain of extensions that goes back to the
    first evidence of a host that has stayed slow, across every job since: the records of the
    last window refolded start the chain elsewhere and give other expiries. And its view spans
    jobs, so it depends on how the partitions' records interleaved, which a snapshot of input
    (folded partition by partition) does not keep. Its state is small (hosts, blocks, the jobs
    of the recent window: the core forgets the rest on finding time), so it is the snapshot.

    The processor attaches the core (`attach`) and hands every row back at a restore (`load`):
    the state row is taken, and a snapshot of input (an older release's) is still folded as
    such."""

    def __init__(self) -> None:
        self._core: StatefulCore | None = None

    def attach(self, core: object) -> None:
        if not isinstance(core, StatefulCore):
            raise TypeError(
                f"retention CoreState needs a core with export_state() and import_state(); "
                f"{type(core).__name__} has neither"
            )
        self._core = core

    def keep(self, record: Record, retained: Retained) -> None:
        """Nothing: the state the core folded the record into is the snapshot."""

    def records(self) -> list[Retained]:
        return [Retained(STATE_PARTITION, 0, self._attached().export_state())]

    def load(self, kept: Retained) -> bool:
        if kept.partition != STATE_PARTITION:
            return False
        self._attached().import_state(kept.value)
        return True

    def _attached(self) -> StatefulCore:
        if self._core is None:
            raise RuntimeError("retention CoreState used before its core was attached")
        return self._core
