"""BlocklistTracker over generated histories: deterministic, never past its fraction; the fleet
forgets without changing a decision, and its state restored anywhere decides as before."""

from __future__ import annotations

import math

from fleet_histories import fleet_history
from hypothesis import given, settings
from hypothesis import strategies as st
from speculation_histories import SimulationParams, simulate, slow_finding
from tests.examples_budget import examples

from tailguard.blocklist.fleet import FleetBlocklist
from tailguard.blocklist.policy import BlocklistTracker, BlockRule, forget_after_ms
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
# FLIP-168's rule and the evidence rule (defaults), and a short window that unblocks early.
modes = st.sampled_from(
    [
        {"blocklist.min-slow-attempts": "1", "blocklist.evidence-window": "0 ms"},
        {},
        {"blocklist.min-slow-attempts": "2", "blocklist.evidence-window": "20 s"},
    ]
)
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


@settings(max_examples=examples(100), deadline=None)
@given(finding_streams(), fractions, modes)
def test_same_findings_give_same_commands(
    stream: list[SlowTasksDetected], fraction: str, mode: dict[str, str]
) -> None:
    config = Settings({**mode, "blocklist.max-blocked-fraction": fraction})
    assert replay(BlocklistTracker(config), stream) == replay(BlocklistTracker(config), stream)


@settings(max_examples=examples(150), deadline=None)
@given(finding_streams(), fractions, modes)
def test_never_blocks_past_the_fraction(
    stream: list[SlowTasksDetected], fraction: str, mode: dict[str, str]
) -> None:
    tracker = BlocklistTracker(Settings({**mode, "blocklist.max-blocked-fraction": fraction}))
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


@settings(max_examples=examples(30), deadline=None)
@given(st.integers(0, 2**32), st.integers(0, 4), fractions)
def test_closed_loop_never_blocks_past_the_fraction(seed: int, slow: int, fraction: str) -> None:
    config = Settings({"blocklist.max-blocked-fraction": fraction})
    run = simulate(SimulationParams(seed=seed, hosts=6, slow_hosts=slow), config)
    for _ts, registered, blocked in run.block_samples:
        assert blocked <= math.floor(float(fraction) * registered)


@settings(max_examples=examples(60), deadline=None)
@given(finding_streams(), modes)
def test_a_new_block_always_has_enough_fresh_evidence(
    stream: list[SlowTasksDetected], mode: dict[str, str]
) -> None:
    """Restated independently: a host newly blocked had at least min-slow-attempts distinct
    subtasks slow on it (and on no other host at the time) within the window."""
    config = Settings({**mode, "blocklist.max-blocked-fraction": "1.0"})
    tracker = BlocklistTracker(config)
    need = config.integer("blocklist.min-slow-attempts")
    window = config.duration_ms("blocklist.evidence-window")
    last_seen: dict[str, dict[tuple[str, int], int]] = {}
    until: dict[str, int] = {}
    for finding in stream:
        for s in finding.slow:
            hosts = {a.host for a in s.live_attempts if a.slow and a.host in finding.hosts}
            if len(hosts) == 1 or (hosts and window == 0):
                for host in hosts:
                    last_seen.setdefault(host, {})[(finding.vertex, s.subtask)] = finding.ts
        for command in tracker.handle(finding):
            if isinstance(command, UnblockNodes):
                for host in command.hosts:
                    until.pop(host, None)
            elif isinstance(command, BlockNodes):
                for host in command.hosts:
                    if until.get(host, 0) <= finding.ts:  # a new block
                        fresh = [
                            k
                            for k, ts in last_seen.get(host, {}).items()
                            if ts >= finding.ts - window
                        ]
                        assert len(fresh) >= need, (host, fresh)
                    until[host] = command.until_ts


# --------------------------------------------------------------------------- forgetting, state

# How far apart the jobs' drivers' clocks are (each off by up to this either way).
skews = st.sampled_from([0, 30_000, 240_000])
fleet_modes = st.sampled_from(
    [
        {},
        {"blocklist.min-slow-attempts": "1", "blocklist.evidence-window": "0 ms"},
        {"blocklist.evidence-window": "10 s", "blocklist.max-blocked-fraction": "0.75"},
        {"execution.batch.speculative.block-slow-node-duration": "5 min"},
    ]
)


def run(fleet: FleetBlocklist, findings: list[SlowTasksDetected]) -> list[Record]:
    return [out for f in findings for out in fleet.handle(f)]


@settings(max_examples=examples(15), deadline=None)
@given(st.integers(0, 2**32), st.integers(5, 60), skews, fleet_modes)
def test_forgetting_changes_no_decision(
    seed: int, jobs: int, skew_ms: int, mode: dict[str, str]
) -> None:
    """The fleet forgets jobs silent and evidence older than 2 x max(window, duration) + 10 min,
    on finding time: over histories of jobs that end, with drivers' clocks up to 8 min apart,
    it decides exactly as a fleet that never forgets, and holds less."""
    findings = [read.finding for read in fleet_history(jobs, seed, skew_ms=skew_ms)]
    config = Settings(mode)
    forgetting = FleetBlocklist(config, publish_view=True)
    never = FleetBlocklist(config, publish_view=True, forget_after=2**62)
    assert run(forgetting, findings) == run(never, findings)
    if findings[-1].ts - findings[0].ts > 2 * forget_after_ms(BlockRule.from_settings(config)):
        assert forgetting.held()["jobs"] < never.held()["jobs"]  # it did forget


@settings(max_examples=examples(25), deadline=None)
@given(st.integers(0, 2**32), st.floats(0, 1), fleet_modes)
def test_a_state_taken_anywhere_decides_as_the_uninterrupted_core(
    seed: int, at: float, mode: dict[str, str]
) -> None:
    findings = [read.finding for read in fleet_history(30, seed)]
    cut = int(at * len(findings))
    config = Settings(mode)
    whole, before = FleetBlocklist(config, True), FleetBlocklist(config, True)
    expected = run(whole, findings)
    prefix = run(before, findings[:cut])
    after = FleetBlocklist(config, True)
    after.import_state(before.export_state())
    assert after.export_state() == before.export_state()
    assert prefix + run(after, findings[cut:]) == expected
    assert after.export_state() == whole.export_state()
    assert after.metrics() == whole.metrics()
