"""BlocklistTracker over generated histories: deterministic, never past its fraction."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st
from speculation_histories import SimulationParams, simulate, slow_finding

from tailguard.blocklist.policy import BlocklistTracker
from tailguard.model.config import Settings
from tailguard.model.records import (
    BlockNodes,
    Record,
    SlowAttempt,
    SlowSubtask,
    SlowTasksDetected,
    UnblockNodes,
)

fractions = st.sampled_from(["0", "0.2", "0.5", "0.75", "1.0"])
ALL_HOSTS = tuple(f"h{i}" for i in range(8))


@st.composite
def finding_streams(draw: st.DrawFn) -> list[SlowTasksDetected]:
    """Findings of one job with rising ts, a cluster that grows and shrinks, random slow
    attempts (some not slow themselves)."""
    stream = []
    ts = 0
    for n in range(draw(st.integers(1, 30))):
        ts += draw(st.integers(0, 40_000))
        hosts = tuple(h for h in ALL_HOSTS if draw(st.booleans())) or ("h0",)
        subtasks = []
        for subtask in range(draw(st.integers(0, 4))):
            live = tuple(
                SlowAttempt(
                    a, draw(st.sampled_from(ALL_HOSTS)), 1, None, a > 0, draw(st.booleans())
                )
                for a in range(draw(st.integers(1, 3)))
            )
            subtasks.append(SlowSubtask(subtask, live, len(live) - 1))
        stream.append(slow_finding(*subtasks, ts=ts, hosts=hosts, finding_id=f"f{n}"))
    return stream


def replay(tracker: BlocklistTracker, stream: list[SlowTasksDetected]) -> list[Record]:
    return [c for f in stream for c in tracker.handle(f)]


@settings(max_examples=100, deadline=None)
@given(finding_streams(), fractions)
def test_same_findings_give_same_commands(stream: list[SlowTasksDetected], fraction: str) -> None:
    config = Settings({"blocklist.max-blocked-fraction": fraction})
    assert replay(BlocklistTracker(config), stream) == replay(BlocklistTracker(config), stream)


@settings(max_examples=150, deadline=None)
@given(finding_streams(), fractions)
def test_never_blocks_past_the_fraction(stream: list[SlowTasksDetected], fraction: str) -> None:
    tracker = BlocklistTracker(Settings({"blocklist.max-blocked-fraction": fraction}))
    until: dict[str, int] = {}  # what the agent holds, from the commands
    for finding in stream:
        commands = tracker.handle(finding)
        for command in commands:
            if isinstance(command, BlockNodes):
                until.update(dict.fromkeys(command.hosts, command.until_ts))
                slow_hosts = {a.host for s in finding.slow for a in s.live_attempts if a.slow}
                assert set(command.hosts) <= slow_hosts
            elif isinstance(command, UnblockNodes):
                for host in command.hosts:
                    until.pop(host, None)
        active = [h for h, end in until.items() if end > finding.ts and h in finding.hosts]
        limit = math.floor(float(fraction) * len(finding.hosts))
        assert len(active) <= min(limit, len(finding.hosts) - 1)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32), st.integers(0, 4), fractions)
def test_closed_loop_never_blocks_past_the_fraction(seed: int, slow: int, fraction: str) -> None:
    config = Settings({"blocklist.max-blocked-fraction": fraction})
    run = simulate(SimulationParams(seed=seed, hosts=6, slow_hosts=slow), config)
    for _ts, registered, blocked in run.block_samples:
        assert blocked <= math.floor(float(fraction) * registered)
