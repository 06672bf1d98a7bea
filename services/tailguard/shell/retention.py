"""What a service's snapshot keeps: the input records its core's state still depends on.

Each service names its rule in its `ServiceDefinition.retention`; every rule is a pure function of
the input order, so a snapshot is a pure function of the input prefix it covers
(tailguard.shell.snapshot says why the snapshot holds input rather than the cores' state).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Protocol

from tailguard.model.records import JobFinished, Record


@dataclass(frozen=True, order=True)
class Retained:
    partition: int
    offset: int
    value: bytes = field(compare=False)


class Retention(Protocol):
    """Which input records the core's state still depends on."""

    def keep(self, record: Record, retained: Retained) -> None: ...

    def records(self) -> list[Retained]:
        """A copy, in any order (the snapshot sorts them by partition and offset, the order the
        core read them in: a job's records are on one partition, keyed by job id)."""
        ...


class EveryRecord:
    def __init__(self) -> None:
        self._kept: list[Retained] = []

    def keep(self, record: Record, retained: Retained) -> None:
        self._kept.append(retained)

    def records(self) -> list[Retained]:
        return list(self._kept)


class _PerJob:
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
