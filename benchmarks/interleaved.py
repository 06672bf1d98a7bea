"""Contenders run in turn, round after round, on one Spark session on `local[2]`, so a change of
load hits them alike: the loop the job benchmarks share (aggregate_phases.py,
broadcast_join.py). Round 0 warms the session up and is not recorded; every output is checked
before a run counts."""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

from tailguard.agent.driver.result import RunResult
from tailguard.agent.graph.api import Job
from tailguard.archive import ArchiveReader
from tailguard.model import records as r
from tailguard.model.config import Settings

T = TypeVar("T")


@dataclass
class Rounds(Generic[T]):
    """What each contender measured per recorded round, and the load after every run."""

    figures: dict[str, list[T]]
    loads: list[float] = field(default_factory=list)

    def seconds(self, contender: str, of: Callable[[T], float]) -> str:
        """The contender's job time: median (min-max)."""
        times = [of(x) for x in self.figures[contender]]
        return f"{statistics.median(times):6.2f} ({min(times):.2f}-{max(times):.2f})"

    def footer(self, of: Callable[[T], float], script: str) -> None:
        """The first contender's median time over the second's, the load, and the command."""
        first, second = list(self.figures)[:2]
        a, b = (statistics.median(of(x) for x in self.figures[c]) for c in (first, second))
        print(f"{first} / {second}: {a / b:.2f}x")
        print(f"load average over the runs: {min(self.loads):.1f}-{max(self.loads):.1f} (2 CPUs)")
        print(f"reproduce: .venv/bin/python benchmarks/{script} " + " ".join(sys.argv[1:]))


def written(archive: str, vertex: str) -> list[tuple[int, ...]]:
    """The bytes per subpartition each finished attempt of `vertex` wrote, from a run's
    archive."""
    return [
        e.record.bytes_per_subpartition
        for e in ArchiveReader(archive)
        if isinstance(e.record, r.AttemptFinished) and e.record.vertex == vertex
    ]


def run_rounds(
    app: str,
    work: Path,
    rounds: int,
    contenders: Mapping[str, Mapping[str, str]],
    job: Callable[[Path], Job],
    check: Callable[[Path], None],
    measure: Callable[[RunResult, float], T],
) -> Rounds[T] | None:
    """Run `job(out)` under each contender's settings, `rounds` + 1 times in turn; `check` the
    output of each run, and keep `measure(result, seconds)` of the recorded ones. None when a
    run failed (its summary printed)."""
    from tailguard.agent.adapters.spark import session_builder
    from tailguard.agent.entry import run

    spark = session_builder("local[2]", app_name=app).getOrCreate()
    measured: Rounds[T] = Rounds({name: [] for name in contenders})
    try:
        for round_ in range(rounds + 1):
            for contender, overrides in contenders.items():
                name = f"{contender}-{round_}"
                out = work / "out" / name
                settings = Settings(
                    {
                        **overrides,
                        "tailguard.work-dir": str(work / "w" / name),
                        "tailguard.archive-dir": str(work / "archive" / name),
                    }
                )
                started = time.monotonic()
                result = run(
                    job(out),
                    spark,
                    log_mode="archive",
                    services=False,
                    settings=settings,
                    progress=False,
                )
                seconds = time.monotonic() - started
                if not result.ok:
                    print(result.summary(), file=sys.stderr)
                    return None
                check(out)
                measured.loads.append(os.getloadavg()[0])
                if round_ == 0:
                    continue
                measured.figures[contender].append(measure(result, seconds))
                print(f"  round {round_} {contender}: {seconds:.2f} s", flush=True)
    finally:
        spark.stop()
    return measured
