"""SpeculationStrategy over generated histories: deterministic, never over the attempt limit."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from speculation_histories import SimulationParams, simulate
from tests.examples_budget import examples

from tailguard.model.config import Settings
from tailguard.model.records import LaunchSpeculativeAttempts, SlowTasksDetected
from tailguard.speculator.policy import SpeculationStrategy

params = st.builds(
    SimulationParams,
    seed=st.integers(0, 2**32),
    sources=st.integers(1, 20),
    consumers=st.integers(1, 8),
    hosts=st.integers(2, 8),
    slow_hosts=st.integers(0, 3),
    failure_rate=st.sampled_from([0.0, 0.05, 0.15]),
)
limits = st.integers(1, 4)


def config(limit: int) -> Settings:
    return Settings({"execution.batch.speculative.max-concurrent-executions": str(limit)})


@settings(max_examples=examples(40), deadline=None)
@given(params, limits)
def test_same_findings_give_same_commands(p: SimulationParams, limit: int) -> None:
    findings = simulate(p, config(limit)).findings
    runs = []
    for _ in range(2):
        strategy = SpeculationStrategy(config(limit))
        runs.append([c for f in findings for c in strategy.handle(f)])
    assert runs[0] == runs[1]


@settings(max_examples=examples(40), deadline=None)
@given(params, limits)
def test_live_attempts_never_exceed_max_concurrent(p: SimulationParams, limit: int) -> None:
    run = simulate(p, config(limit))
    # In the closed loop (the agent applying every launch it can place)...
    assert run.max_live_per_subtask <= max(limit, 1)
    # ...and per answered state: the live attempts the finding saw plus all launches for it.
    first_live: dict[tuple[str, int, int], int] = {}
    for finding in run.findings:
        if isinstance(finding, SlowTasksDetected):
            for s in finding.slow:
                key = (finding.vertex, s.subtask, s.latest_attempt)
                first_live.setdefault(key, len(s.live_attempts))
    launched: dict[tuple[str, int, int], int] = {}
    by_id = {f.id: f for f in run.findings if isinstance(f, SlowTasksDetected)}
    for command in run.commands:
        if isinstance(command, LaunchSpeculativeAttempts):
            (cause,) = command.caused_by
            (state,) = [s for s in by_id[cause].slow if s.subtask == command.subtask]
            key = (command.vertex, command.subtask, state.latest_attempt)
            launched[key] = launched.get(key, 0) + command.count
    for key, count in launched.items():
        assert first_live[key] + count <= limit
