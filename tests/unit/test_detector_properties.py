"""SlowTaskDetector over generated job histories: deterministic, also across processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from profiles import both_profiles  # noqa: F401  (each test under both profiles)
from speculation_histories import SimulationParams, simulate
from tests.examples_budget import examples

from tailguard.detector.policy import SlowTaskDetector
from tailguard.model.config import Settings
from tailguard.model.records import Record, SlowTasksDetected

params = st.builds(
    SimulationParams,
    seed=st.integers(0, 2**32),
    sources=st.integers(1, 20),
    consumers=st.integers(1, 8),
    hosts=st.integers(2, 8),
    slow_hosts=st.integers(0, 3),
    failure_rate=st.sampled_from([0.0, 0.02, 0.1]),
)


def detect(events: list[Record]) -> list[Record]:
    detector = SlowTaskDetector(Settings())
    return [finding for event in events for finding in detector.handle(event)]


@settings(max_examples=examples(40), deadline=None)
@given(params)
def test_same_events_give_same_findings(p: SimulationParams) -> None:
    events = simulate(p).events
    first = detect(list(events))
    assert first == detect(list(events))


@settings(max_examples=examples(40), deadline=None)
@given(params)
def test_findings_only_on_ticks_or_a_new_slow_host_and_only_live_attempts_listed(
    p: SimulationParams,
) -> None:
    run = simulate(p)
    ticks = {e.id for e in run.events if type(e).__name__ in ("Tick", "JobFinished")}
    # Between Ticks, only the slow-host rule checks: at the report that shows a host slow, and
    # only then.
    evidence = {e.id for e in run.events if type(e).__name__ == "AttemptProgress"}
    for finding in run.findings:
        if isinstance(finding, SlowTasksDetected):
            cause = set(finding.caused_by)
            assert cause <= ticks or (cause <= evidence and finding.slow_hosts), finding
            for subtask in finding.slow:
                assert any(a.slow for a in subtask.live_attempts)
                assert len({a.attempt for a in subtask.live_attempts}) == len(subtask.live_attempts)


def test_findings_do_not_depend_on_hash_randomisation() -> None:
    script = (
        "from speculation_histories import SimulationParams, simulate\n"
        "run = simulate(SimulationParams(seed=7, sources=16, consumers=6, slow_hosts=2))\n"
        "print([f.id for f in run.findings] + [c.id for c in run.commands])\n"
    )
    outputs = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", script],
            cwd=Path(__file__).parent,
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        outputs.add(done.stdout)
    assert len(outputs) == 1
    assert "detector-" in outputs.pop()
