"""The comparison table, and the same figures as JSON.

`rows` holds only simulated results (a pure function of the scenario and the policies), so two
runs with the same seed give equal rows; wall-clock speeds are kept apart in `speeds`.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict
from typing import Any

from sim.engine import Outcome

HEADER = (
    "policy",
    "job completion (s)",
    "vs none",
    "speculative attempts",
    "speculative wins",
    "extra work (task-s)",
    "hosts blocked (slow)",
)


def row(outcome: Outcome, baseline_ms: int | None) -> dict[str, Any]:
    change = None
    if baseline_ms:
        change = round((outcome.completion_ms - baseline_ms) / baseline_ms * 100, 2)
    return {
        "policy": outcome.policy,
        "completion_s": round(outcome.completion_ms / 1000, 3),
        "vs_none_pct": change,
        "speculative_attempts": outcome.speculative_attempts,
        "speculative_wins": outcome.speculative_wins,
        "extra_work_task_s": round(outcome.speculative_work_ms / 1000, 1),
        "hosts_blocked": len(outcome.hosts_blocked),
        "slow_hosts_blocked": outcome.slow_hosts_blocked,
        "speculated_skewed": outcome.speculated_skewed,
        "speculated_on_slow_host": outcome.speculated_on_slow,
        "speculated_skew_only": outcome.speculated_skew_only,
        "skew_only_wins": outcome.skew_only_wins,
        "healthy_hosts_blocked": len(outcome.hosts_blocked) - outcome.slow_hosts_blocked,
        "tasks": outcome.tasks,
    }


def speed(outcome: Outcome) -> dict[str, Any]:
    return {
        "policy": outcome.policy,
        "wall_s": round(outcome.wall_seconds, 3),
        "tasks_per_wall_s": round(outcome.tasks / max(outcome.wall_seconds, 1e-9)),
    }


LEGEND = (
    "extra work: simulated seconds run by speculative attempts, winners and cancelled alike;"
    " hosts blocked: distinct hosts ever blocked (of them slow)"
)


def table(rows: list[dict[str, Any]]) -> list[str]:
    cells = [list(HEADER)]
    for r in rows:
        change = "—" if r["vs_none_pct"] is None else f"{r['vs_none_pct']:+.1f}%"
        blocked = f"{r['hosts_blocked']} ({r['slow_hosts_blocked']})" if r["hosts_blocked"] else "0"
        cells.append(
            [
                r["policy"],
                f"{r['completion_s']:,.1f}",
                change,
                f"{r['speculative_attempts']:,}",
                f"{r['speculative_wins']:,}",
                f"{r['extra_work_task_s']:,.0f}",
                blocked,
            ]
        )
    return render(cells)


def render(cells: list[list[str]], text_columns: int = 1) -> list[str]:
    """A Markdown table of `cells` (the first row is the header): the first `text_columns`
    columns left-aligned, the figures right-aligned."""
    widths = [max(len(c[i]) for c in cells) for i in range(len(cells[0]))]
    lines = []
    for index, c in enumerate(cells):
        lines.append(
            "| "
            + " | ".join(
                c[i].ljust(widths[i]) if i < text_columns else c[i].rjust(widths[i])
                for i in range(len(c))
            )
            + " |"
        )
        if index == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return lines


def seeds_summary(runs: dict[int, list[dict[str, Any]]]) -> list[str]:
    """Per policy over several seeds: completion time mean and range, change against none
    (mean of the per-seed changes), mean attempts, wins and extra work, the most healthy hosts
    blocked on any seed, and copies of tasks that were only skewed (all seeds)."""
    policies = [r["policy"] for r in next(iter(runs.values()))]
    lines = [
        f"  {'policy':<22} {'completion s: mean':>18} {'min':>9} {'max':>9} {'vs none':>8}"
        f" {'attempts':>9} {'wins':>6} {'extra task-s':>12} {'healthy blocked (max)':>21}"
        f" {'skew-only copies':>16}"
    ]
    for policy in policies:
        mine = [next(r for r in rows if r["policy"] == policy) for rows in runs.values()]
        times = [r["completion_s"] for r in mine]
        changes = [r["vs_none_pct"] for r in mine if r["vs_none_pct"] is not None]
        change = f"{sum(changes) / len(changes):+.1f}%" if changes else "—"
        n = len(mine)
        lines.append(
            f"  {policy:<22} {sum(times) / n:>18,.1f} {min(times):>9,.1f} {max(times):>9,.1f}"
            f" {change:>8} {sum(r['speculative_attempts'] for r in mine) / n:>9,.0f}"
            f" {sum(r['speculative_wins'] for r in mine) / n:>6,.0f}"
            f" {sum(r['extra_work_task_s'] for r in mine) / n:>12,.0f}"
            f" {max(r['healthy_hosts_blocked'] for r in mine):>21,}"
            f" {sum(r['speculated_skew_only'] for r in mine):>16,}"
        )
    return lines


def trace(outcome: Outcome) -> dict[str, Any]:
    """What ended each stage, and how long a slow-host first attempt ran before its copy
    started (simulated ms): the evidence for where a policy loses time."""
    return {
        "policy": outcome.policy,
        "stage_ends": [asdict(end) for end in outcome.stage_ends],
        "slow_host_copy_delay_ms": _spread(outcome.slow_host_copy_delays_ms),
        "slow_host_ask_delay_ms": _spread(outcome.slow_host_ask_delays_ms),
    }


def _spread(values: tuple[int, ...]) -> dict[str, Any]:
    ordered = sorted(values)
    return {
        "count": len(ordered),
        "median": statistics.median(ordered) if ordered else None,
        "p90": ordered[int(0.9 * (len(ordered) - 1))] if ordered else None,
        "max": ordered[-1] if ordered else None,
    }


def trace_lines(t: dict[str, Any]) -> list[str]:
    lines = [f"{t['policy']}: after a slow-host first attempt started,"]
    for key, what in (("slow_host_ask_delay_ms", "asked"), ("slow_host_copy_delay_ms", "started")):
        d = t[key]
        if d["count"]:
            lines.append(
                f"  {d['count']} copies {what} after median {_s(d['median'])},"
                f" p90 {_s(d['p90'])}, max {_s(d['max'])}"
            )
    for end in t["stage_ends"]:
        kind = "skewed" if end["skewed"] else "plain"
        if end["first_on_slow_host"]:
            kind += ", first on a slow host"
        won = "copy" if end["winner_speculative"] else "first attempt"
        lines.append(
            f"  stage {end['stage']} ended {end['end_ms'] / 1000:,.1f} s by subtask"
            f" {end['subtask']} ({kind}; {won} won, started {end['winner_start_ms'] / 1000:,.1f} s;"
            f" first started {end['first_start_ms'] / 1000:,.1f} s; stage's last first"
            f" attempt started {end['last_first_start_ms'] / 1000:,.1f} s)"
        )
    return lines


def _s(ms: float | None) -> str:
    return "-" if ms is None else f"{ms / 1000:,.1f} s"
