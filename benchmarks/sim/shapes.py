"""Host-slowness shapes: one scenario per way a node can be slow, the same contenders on each.

Issue 24 asks how tailguard's defaults compare with LATE, Spark's rule and Flink's rule when the
slow node is 5x slow, only 1.5x slow, turns slow mid-job, is slow only for I/O, or is absent.
Each shape overrides the scenario's slow hosts (the rest of the scenario, skew included, is the
one `ScenarioParams` describes); every shape runs the same seeds, and the table gives per shape
and contender the mean job time, the change against no speculation, the mean extra work and
the most healthy hosts blocked on any seed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from sim.report import render
from sim.scenario import ScenarioParams

# The contenders of the shapes table, in its order.
SHAPE_POLICIES = ("none", "tailguard", "tailguard-flip168", "spark", "LATE")

# A node slow only for I/O: the source stage is mostly I/O, the later ones mostly CPU.
IO_SHARES = (0.8, 0.2)


def onset_ms(params: ScenarioParams) -> int:
    """Mid-job: 40% into the job's nominal length (waves of median tasks on every slot)."""
    waves = params.tasks / (params.hosts * params.slots)
    return round(0.4 * waves * params.median_ms)


def shapes(params: ScenarioParams) -> dict[str, ScenarioParams]:
    """Shape name -> its scenario, from `params` (whose slow fraction says how many nodes)."""
    fixed = {"slow_min": 5.0, "slow_max": 5.0}
    return {
        "5x node": replace(params, **fixed),
        "1.5x node": replace(params, slow_min=1.5, slow_max=1.5),
        "5x from mid-job": replace(params, **fixed, slow_onset_ms=onset_ms(params)),
        "5x for I/O only": replace(params, **fixed, io_shares=IO_SHARES),
        "no slow node": replace(params, slow_fraction=0.0),
    }


Runner = Callable[[ScenarioParams, list[str]], list[dict[str, Any]]]


def run_shapes(
    params: ScenarioParams, seeds: int, runner: Runner, policies: tuple[str, ...] = SHAPE_POLICIES
) -> dict[str, dict[int, list[dict[str, Any]]]]:
    """Shape -> seed -> the rows `runner` gives for that scenario and the contenders."""
    out: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for name, scenario in shapes(params).items():
        out[name] = {}
        for seed in range(params.seed, params.seed + seeds):
            out[name][seed] = runner(replace(scenario, seed=seed), list(policies))
    return out


HEADER = (
    "shape",
    "policy",
    "job time (s)",
    "vs none",
    "extra work (task-s)",
    "healthy hosts blocked (max)",
    "slow hosts blocked",
)


def shapes_table(results: dict[str, dict[int, list[dict[str, Any]]]]) -> list[str]:
    """Means over the seeds; healthy hosts blocked: the most on any one seed."""
    cells = [list(HEADER)]
    for shape, runs in results.items():
        policies = [r["policy"] for r in next(iter(runs.values()))]
        for policy in policies:
            mine = [next(r for r in rows if r["policy"] == policy) for rows in runs.values()]
            n = len(mine)
            changes = [r["vs_none_pct"] for r in mine if r["vs_none_pct"] is not None]
            cells.append(
                [
                    shape,
                    policy,
                    f"{sum(r['completion_s'] for r in mine) / n:,.1f}",
                    f"{sum(changes) / len(changes):+.1f}%" if changes else "—",
                    f"{sum(r['extra_work_task_s'] for r in mine) / n:,.0f}",
                    f"{max(r['healthy_hosts_blocked'] for r in mine)}",
                    f"{sum(r['slow_hosts_blocked'] for r in mine) / n:g}",
                ]
            )
    return render(cells, text_columns=2)
