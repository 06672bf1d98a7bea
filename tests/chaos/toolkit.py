"""What every chaos case shares: the job, the fault's hooks, and the figures a case records.

A case runs the sales example through `run_job` with a `Fault` as its `JobHooks`. The
fault acts at a moment given by an event the driver publishes (the first `AttemptFinished`, the
first one after a restart): the driver calls `on_event` on its own thread right after publishing,
so work that must happen before the driver schedules anything (deleting a partition before its
consumer is deployed) is done there, and anything slow (restarting a service) in a thread of the
fault's own. Whatever happens, the case then records its figures (`CaseResult`) before it asserts
the issue's targets, so the report says what happened also when a target is missed.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tailguard.agent.driver.driver import JobDriver
from tailguard.agent.driver.hooks import JobHooks
from tailguard.agent.executor.environment import tailguard_build
from tailguard.examples import sales_by_region as example
from tailguard.model import records as r
from tailguard.testing import JobRun, Services, assert_output_equals, run_job

# The sales example runs as two chains: HEAD produces the partitions TAIL consumes.
HEAD = "sales→score→partial"
TAIL = "final→sink"


@dataclass
class CaseResult:
    """One case's figures: the row of the report."""

    case: str  # also the job's name: letters, digits, '_', '.', '-'
    outcome: str = "NOT RUN"  # the job's status, or the error that ended the case early
    exact: bool | None = None
    replay_differences: int | None = None
    applied_twice: int | None = None
    faults: int = 0  # how many times the fault was injected
    recover_s: float | None = None  # the slowest recovery of the case (see `recovered_when`)
    job_s: float | None = None
    note: str = ""

    def row(self) -> dict[str, Any]:
        return asdict(self)

    def missed(self) -> list[str]:
        """The issue's targets this case missed (empty when it met all of them)."""
        missed = []
        if self.outcome != "SUCCEEDED":
            missed.append(f"job {self.outcome}")
        if self.exact is not True:
            missed.append("output not exact" if self.exact is False else "output not checked")
        if self.replay_differences:
            missed.append(f"{self.replay_differences} replay difference(s)")
        if self.applied_twice:
            missed.append(f"{self.applied_twice} command(s) applied twice")
        if not self.faults:
            missed.append("the fault was never injected")
        return missed


class Fault:
    """A fault's hooks into one run. Subclasses override `on_event` (call super first) and use
    `background` for anything slower than a file operation."""

    def __init__(self) -> None:
        self.driver: JobDriver | None = None
        self.injected = 0
        self.recoveries: list[float] = []
        self.notes: list[str] = []
        self._errors: list[str] = []
        self._threads: list[threading.Thread] = []
        # (predicate, started) pairs: the first event matching predicate ends a recovery.
        self._watching: list[tuple[Callable[[r.Event], bool], float]] = []
        self._lock = threading.Lock()

    def hooks(self) -> JobHooks:
        return JobHooks(on_event=self._event, on_start=self._start)

    def _start(self, driver: JobDriver) -> None:
        self.driver = driver

    def _event(self, event: r.Event) -> None:
        now = time.monotonic()
        with self._lock:
            still: list[tuple[Callable[[r.Event], bool], float]] = []
            for predicate, started in self._watching:
                if predicate(event):
                    self.recoveries.append(now - started)
                else:
                    still.append((predicate, started))
            self._watching = still
        try:
            self.on_event(event)
        except Exception:  # the driver must not die of the test's own bug: report it instead
            self._errors.append(traceback.format_exc())

    def on_event(self, event: r.Event) -> None:
        """Decide from `event` whether to act (on the driver's thread)."""

    def recovered_when(self, predicate: Callable[[r.Event], bool], started: float) -> None:
        """Count the time from `started` (monotonic) to the first event matching `predicate`
        as one recovery."""
        with self._lock:
            self._watching.append((predicate, started))

    def background(self, action: Callable[[], None]) -> None:
        def guarded() -> None:
            try:
                action()
            except Exception:
                self._errors.append(traceback.format_exc())

        thread = threading.Thread(target=guarded, name="chaos-fault", daemon=True)
        self._threads.append(thread)
        thread.start()

    def finish(self, timeout_s: float = 120.0) -> list[str]:
        """Wait for the fault's own threads; the errors they or the hooks raised."""
        for thread in self._threads:
            thread.join(timeout_s)
            if thread.is_alive():
                self._errors.append(f"the fault's thread still runs after {timeout_s:.0f} s")
        if self._watching:
            self.notes.append(f"{len(self._watching)} recovery event(s) never came")
        return self._errors


def applied_twice(run: JobRun) -> int:
    """How many command ids the driver applied more than once (a restarted service re-emits
    its decisions with the same ids; the agent must apply each once)."""
    applied = Counter(e.command_id for e in run.of(r.CommandApplied))
    return sum(1 for n in applied.values() if n > 1)


@dataclass
class SalesData:
    path: Path
    reference: Any = field(repr=False)


def sales_data(directory: Path, files: int, rows: int) -> SalesData:
    data = example.generate(directory, files=files, rows_per_file=rows)
    return SalesData(data, example.reference(data))


def run_case(
    result: CaseResult,
    fault: Fault,
    data: SalesData,
    spark: Any,
    services: Services,
    work: Path,
    *,
    work_per_row: int,
    io_s_per_row: float = 0.0,
    settings: dict[str, str] | None = None,
    storage: str | None = None,
    replay_ignores: Callable[[r.Record], bool] | None = None,
) -> JobRun | None:
    """Run the sales job under `fault` and fill `result` with what happened. `replay_ignores`
    names records the case itself put in the job's log (forged ones) that replay is right to
    flag: they are counted apart, in the note. `work_per_row` and `io_s_per_row` are the job's
    CPU and I/O-bound work per row (`sales_by_region.make_job`)."""
    # The driver caches its build digest once per process, and the executors compute theirs
    # at each job's start: a .py file edited since this process's first job (other work in
    # the same tree) would refuse every later job's runners ("build differs"). Each case
    # compares the tree as it is at its own start.
    tailguard_build.cache_clear()
    began = time.monotonic()
    try:
        job = example.make_job(
            data.path, work / "out", work_per_row, result.case, io_s_per_row=io_s_per_row
        )
        run = run_job(
            job,
            spark,
            work,
            services=services,
            settings=settings,
            hooks=fault.hooks(),
            storage=storage,
        )
    except Exception as err:  # the run itself raised: that is the case's outcome
        result.outcome = f"raised {type(err).__name__}: {err}"[:300]
        errors = fault.finish()
        result.faults = fault.injected
        result.note = "; ".join([*fault.notes, *errors])[:500]
        return None
    result.job_s = round(time.monotonic() - began, 1)
    errors = fault.finish()
    result.faults = fault.injected
    result.recover_s = round(max(fault.recoveries), 2) if fault.recoveries else None
    result.outcome = run.result.status
    try:
        assert_output_equals(run, data.reference, ignore_order=True)
        result.exact = True
    except AssertionError as differs:
        result.exact = False
        fault.notes.append(str(differs).splitlines()[0][:200])
    result.replay_differences = replay_differences(run, replay_ignores, fault.notes)
    result.applied_twice = applied_twice(run)
    if errors:
        fault.notes.append(
            "fault errors: " + " | ".join(e.strip().splitlines()[-1] for e in errors)
        )
    result.note = "; ".join(fault.notes)[:500]
    return run


def replay_differences(
    run: JobRun, ignores: Callable[[r.Record], bool] | None, notes: list[str]
) -> int:
    """Replay's differences for the run, less the forged records `ignores` names (a record no
    service emits is unattributed, which replay counts: the audit doing its job)."""
    from tailguard.replay.engine import replay

    try:
        report = replay(run.recorded, run.settings)
    except Exception as err:
        notes.append(f"replay raised {type(err).__name__}: {err}"[:200])
        return -1
    forged = [x for x in report.unattributed if ignores is not None and ignores(x)]
    if forged:
        notes.append(f"replay flags the {len(forged)} forged record(s) as unattributed")
    for service in report.services:
        for difference in service.differences[:2]:
            notes.append(f"{service.service}: {difference.describe()}"[:200])
    return report.differences - len(forged)
