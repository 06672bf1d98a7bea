"""The scale simulator (benchmarks/simulate.py, benchmarks/sim/) on small scenarios.

The benchmark is not a package: its directory goes on sys.path, as when it runs as a script.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

from sim.baselines import Late, SparkRule  # noqa: E402
from sim.engine import Attempt, Policy, Simulation  # noqa: E402
from sim.scenario import ScenarioParams, build  # noqa: E402
from sim.tailguard_driver import TailguardPolicy  # noqa: E402


def _load_cli() -> ModuleType:
    spec = importlib.util.spec_from_file_location("simulate_cli", BENCHMARKS / "simulate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


simulate = _load_cli()

SMALL = {"hosts": 50, "tasks": 2_000}


def rows(params: ScenarioParams) -> dict[str, dict[str, Any]]:
    return {r["policy"]: r for r in simulate.run(params)["rows"]}


# --------------------------------------------------------------------------- reproducibility


@pytest.mark.long
def test_same_seed_gives_the_same_table_and_another_seed_does_not() -> None:
    params = ScenarioParams(seed=11, **SMALL)
    first = simulate.run(params)["rows"]
    assert simulate.run(params)["rows"] == first
    assert simulate.run(ScenarioParams(seed=12, **SMALL))["rows"] != first


@pytest.mark.long
def test_same_seed_gives_the_same_table_in_another_process(tmp_path: Path) -> None:
    """Nothing may depend on string hashing (randomised per process) or on wall time."""
    out = tmp_path / "result.json"
    command = [sys.executable, str(BENCHMARKS / "simulate.py"), "--hosts", "50"]
    command += ["--tasks", "2000", "--seed", "5", "--json", str(out), "--quiet"]
    env = {**os.environ, "PYTHONHASHSEED": "4242"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "| tailguard" in done.stdout and "lognormal" in done.stdout
    expected = simulate.run(ScenarioParams(seed=5, **SMALL))["rows"]
    assert json.loads(out.read_text())["rows"] == expected


# --------------------------------------------------------------------------- sanity


@pytest.mark.long
@pytest.mark.parametrize("seed", [1, 2])
def test_with_slow_hosts_tailguard_and_late_finish_sooner_than_none(seed: int) -> None:
    result = rows(ScenarioParams(seed=seed, slow_fraction=0.1, skew_fraction=0.0, **SMALL))
    none = result["none"]["completion_s"]
    for policy in ("tailguard", "tailguard-progress", "LATE"):
        assert result[policy]["completion_s"] < 0.9 * none, (policy, result)
        assert result[policy]["speculative_wins"] > 0
    # tailguard blocks the slow hosts (5 of 50 here), among others it saw slow attempts on.
    assert result["tailguard"]["slow_hosts_blocked"] >= 3


def test_without_slow_hosts_or_skew_speculation_stays_rare() -> None:
    params = ScenarioParams(
        seed=3, slow_fraction=0.0, skew_fraction=0.0, sigma=0.1, attempt_sigma=0.05, **SMALL
    )
    result = rows(params)
    assert result["tailguard"]["speculative_attempts"] <= 5
    assert result["tailguard"]["hosts_blocked"] <= 5
    assert result["spark"]["speculative_attempts"] <= 5
    # LATE always has a slowest quartile of progress rates, so it mirrors at every stage's tail;
    # its cap bounds how many run at once, and in a homogeneous cluster they rarely win.
    stages = len(params.stage_shares)
    cap = int(0.1 * params.hosts * params.slots)
    assert result["LATE"]["speculative_attempts"] <= cap * stages
    assert result["LATE"]["speculative_wins"] <= 5


@pytest.mark.long
def test_tailguard_does_not_mirror_tasks_slow_only_from_their_input_bytes() -> None:
    params = ScenarioParams(
        seed=4, slow_fraction=0.0, skew_fraction=0.02, sigma=0.05, attempt_sigma=0.05, **SMALL
    )
    result = rows(params)
    # The skewed tasks do look slow by plain runtime: Spark's rule mirrors them.
    assert result["spark"]["speculated_skewed"] >= 10
    for policy in ("tailguard", "tailguard-progress"):
        assert result[policy]["speculated_skewed"] == 0
        assert result[policy]["speculative_attempts"] == 0
        assert result[policy]["hosts_blocked"] == 0


# --------------------------------------------------------------------------- engine rules


class _Audit:
    """Wraps a policy's hooks to check the agent-side rules on every placement."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.violations: list[str] = []
        deployed = policy.deployed

        def audited(attempt: Attempt) -> None:
            hosts = [a.host for a in attempt.task.live]
            if len(hosts) != len(set(hosts)):
                self.violations.append(f"two live attempts on one host: {attempt.task.index}")
            until = getattr(policy, "blocked_until", {}).get(attempt.host, 0)
            if until > policy.sim.now:
                self.violations.append(f"attempt placed on blocked host {attempt.host}")
            deployed(attempt)

        policy.deployed = audited  # type: ignore[method-assign]


@pytest.mark.parametrize(
    "make",
    [
        TailguardPolicy,
        lambda: TailguardPolicy(variant="tailguard-progress"),
        lambda: TailguardPolicy(variant="tailguard-flip168"),
        SparkRule,
        Late,
    ],
)
def test_every_task_finishes_once_and_every_slot_comes_back(make: Callable[[], Policy]) -> None:
    scenario = build(ScenarioParams(seed=6, slow_fraction=0.1, **SMALL))
    audit = _Audit(make())
    sim = Simulation(scenario, audit.policy)
    outcome = sim.run()
    assert audit.violations == []
    assert outcome.tasks == 2_000
    assert all(task.done and not task.live for stage in sim.stages for task in stage)
    assert not sim.running
    assert len(sim.free) + sum(sim._parked.values()) == 50 * 2
    assert 0 < outcome.speculative_wins <= outcome.speculative_attempts


def test_tailguard_cores_see_the_agents_events() -> None:
    policy = TailguardPolicy()
    Simulation(build(ScenarioParams(seed=2, slow_fraction=0.1, **SMALL)), policy).run()
    speculator = policy.speculator.metrics()
    blocklist = policy.blocklist.metrics()
    # Wins are reported by the detector from AttemptFinished of mirrors, counted by the
    # speculator from SpeculativeAttemptWon: the events reached the cores in order.
    assert speculator["numEffectiveSpeculativeExecutions"] > 0
    assert speculator["speculativeAttemptsLaunched"] > 0
    assert blocklist["hostsBlocked"] > 0
    # JobFinished cleared the job's slow vertices.
    assert speculator["numSlowExecutionVertices"] == 0


# --------------------------------------------------------------------------- the new contenders


def test_progress_rule_finds_stragglers_of_a_single_wave_stage() -> None:
    """One stage of exactly one wave (as many tasks as slots), slow hosts, no skew: Flink's rule
    waits for 75% of the stage and its 40 s lower bound; the progress rule sees the slow rate
    after 10 s and copies at once."""
    params = ScenarioParams(
        seed=7, hosts=50, tasks=100, stage_shares=(1.0,), slow_fraction=0.1, skew_fraction=0.0
    )
    result = {
        r["policy"]: r
        for r in simulate.run(params, ["tailguard-flink", "tailguard-progress"])["rows"]
    }
    progress, flink = result["tailguard-progress"], result["tailguard-flink"]
    assert progress["speculative_wins"] > 0
    assert progress["completion_s"] < 0.8 * flink["completion_s"], result


def test_slow_host_rule_copies_a_slow_hosts_attempts_within_seconds() -> None:
    """The same single-wave stage under the defaults: the slow-host rule finds each slow host
    at its attempts' third progress report (1 s apart), blocks it, and copies its attempts."""
    params = ScenarioParams(
        seed=7, hosts=50, tasks=100, stage_shares=(1.0,), slow_fraction=0.1, skew_fraction=0.0
    )
    scenario = build(params)
    flink = Simulation(scenario, TailguardPolicy(variant="tailguard-flink")).run()
    default = Simulation(scenario, TailguardPolicy(variant="tailguard")).run()
    assert default.slow_host_ask_delays_ms and max(default.slow_host_ask_delays_ms) <= 4_000
    assert default.slow_hosts_blocked == len(scenario.slow_hosts)
    assert len(default.hosts_blocked) == default.slow_hosts_blocked
    assert default.completion_ms < 0.8 * flink.completion_ms, (default, flink)


def test_shapes_change_only_the_slow_hosts() -> None:
    from sim.shapes import onset_ms, shapes

    params = ScenarioParams(**SMALL)
    by_name = shapes(params)
    assert list(by_name) == [
        "5x node",
        "1.5x node",
        "5x from mid-job",
        "5x for I/O only",
        "no slow node",
    ]
    io = build(by_name["5x for I/O only"])
    (slow, *_) = sorted(io.slow_hosts)
    assert io.host_time_factor(slow, 0, 0) == 0.2 + 0.8 * 5
    assert io.host_time_factor(slow, 3, 0) == 0.8 + 0.2 * 5
    late = build(by_name["5x from mid-job"])
    onset = onset_ms(params)
    assert late.host_time_factor(slow, 0, onset - 1) == 1.0
    assert late.host_time_factor(slow, 0, onset) == 5.0
    assert build(by_name["no slow node"]).slow_hosts == frozenset()
    assert build(by_name["5x node"]).stages == build(params).stages


def test_evidence_blocklist_blocks_fewer_healthy_hosts_than_flip168() -> None:
    params = ScenarioParams(seed=8, slow_fraction=0.1, sigma=0.3, attempt_sigma=0.2, **SMALL)
    result = {
        r["policy"]: r for r in simulate.run(params, ["tailguard-flip168", "tailguard"])["rows"]
    }
    flip168, evidence = result["tailguard-flip168"], result["tailguard"]
    assert flip168["healthy_hosts_blocked"] > evidence["healthy_hosts_blocked"], result
    assert evidence["slow_hosts_blocked"] > 0


def test_the_late_oracle_never_copies_an_only_skewed_task_where_late_does():
    from sim.baselines import LateOracle

    scenario = build(ScenarioParams(hosts=50, tasks=2_000, seed=3, skew_fraction=0.05))
    late = Simulation(scenario, Late()).run()
    oracle = Simulation(scenario, LateOracle()).run()
    assert late.speculated_skew_only > 0  # the case the oracle exists for
    assert oracle.speculated_skew_only == 0
    assert oracle.policy == "LATE-oracle" and oracle.speculative_attempts > 0


def test_largest_input_first_starts_the_skewed_tasks_early_and_ends_stages_sooner() -> None:
    """With no slow hosts and no speculation, what ends a stage is a skewed task started in the
    last wave; the agent's largest-input-first order starts it in the first."""
    from sim.baselines import NoSpeculation
    from tailguard.agent.driver.ordering import SubtaskOrder

    class LargestFirst(NoSpeculation):
        name = "none-lpt"
        subtask_order = SubtaskOrder.LARGEST_INPUT_FIRST

    scenario = build(ScenarioParams(hosts=50, tasks=2_000, seed=3, slow_fraction=0.0))
    plain = Simulation(scenario, NoSpeculation()).run()
    ordered = Simulation(scenario, LargestFirst()).run()
    assert all(end.skewed for end in plain.stage_ends)
    assert ordered.completion_ms < 0.9 * plain.completion_ms, (plain, ordered)
