"""From the raw runs to the figures and the markdown report (pure: no Spark, no I/O)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tailguard.bench import report
from tailguard.bench.scenarios import (
    CONTENDERS,
    PLAIN_CONTENDERS,
    SCENARIOS,
    SERVICES_CONTENDER,
    Scenario,
)

HEALTHY = "S4"
SLOTS = 3
Run = Mapping[str, Any]  # one run as stored in the JSON (`RunRecord` as a dict)


@dataclass
class ScenarioFigures:
    scenario: Scenario
    medians: dict[str, float]
    best_plain: str | None
    ideal_s: float | None
    limit_s: float | None
    table: str
    goals: list[str] = field(default_factory=list)


def _ok_times(runs: Sequence[Run], scenario: str, contender: str) -> list[float]:
    return [
        float(x["job_s"])
        for x in runs
        if x["scenario"] == scenario and x["contender"] == contender and x["ok"]
    ]


def healthy_limits(runs: Sequence[Run], scenario: Scenario) -> dict[str, float]:
    """The physical limit of `scenario` per contender: the median over that contender's healthy
    (S4) runs of the limit computed from the run's own task times."""
    per: dict[str, list[float]] = {}
    for x in runs:
        if x["scenario"] == HEALTHY and x["ok"] and x.get("stage_work"):
            stages = [report.StageWork(**s) for s in x["stage_work"]]
            per.setdefault(x["contender"], []).append(
                report.physical_limit(stages, SLOTS, scenario.slow_factor, scenario.slow_for_s)
            )
    return {c: report.spread(v).median for c, v in per.items()}


def figures(runs: Sequence[Run], scenario: Scenario) -> ScenarioFigures:
    name = scenario.name
    rows = []
    medians: dict[str, float] = {}
    for c in CONTENDERS:
        mine = [x for x in runs if x["scenario"] == name and x["contender"] == c.name]
        times = _ok_times(runs, name, c.name)
        if times:
            medians[c.name] = report.spread(times).median
        rows.append(
            report.Row(
                c.name,
                times,
                [x.get("speculative_attempts") for x in mine if x["ok"]],
                [len(x["blocked_hosts"]) if c.tailguard else None for x in mine if x["ok"]],
                failed=sum(1 for x in mine if not x["ok"]),
            )
        )
    plain = {c: medians[c] for c in PLAIN_CONTENDERS if c in medians}
    best_plain = min(plain, key=plain.__getitem__) if plain else None
    healthy = {
        c: report.spread(t).median
        for c in (c.name for c in CONTENDERS)
        if (t := _ok_times(runs, HEALTHY, c))
    }
    ideal = min(healthy.values()) if healthy and scenario.shape == "sales" else None
    extra: dict[str, float | None] = {}
    limit = None
    if scenario.shape == "sales":
        extra["ideal: best median on a healthy cluster (S4)"] = ideal
        if scenario.has_slow_node:
            # The least total work any contender needed gives the tightest bound.
            limits = healthy_limits(runs, scenario)
            source = min(limits, key=limits.__getitem__) if limits else None
            limit = limits[source] if source else None
            label = f"of {source}" if source else "needed: run S4 too"
            extra[f"physical limit (from S4 task times {label})"] = limit
    table = report.scenario_table(rows, best_plain, extra)
    out = ScenarioFigures(scenario, medians, best_plain, ideal, limit, table)
    out.goals = goals(out, runs)
    return out


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def goals(f: ScenarioFigures, runs: Sequence[Run]) -> list[str]:
    tg = f.medians.get(SERVICES_CONTENDER)
    ref = f.medians.get(f.best_plain) if f.best_plain else None
    lines = []
    if f.scenario.name == "S1" and tg is not None:
        if ref:
            ratio = tg / ref
            lines.append(
                f"tailguard+services / best plain ({f.best_plain}) = {ratio:.2f} "
                f"(goal < 0.8: {_verdict(ratio < 0.8)})"
            )
        if f.limit_s:
            ratio = tg / f.limit_s
            lines.append(
                f"tailguard+services / physical limit = {ratio:.2f} "
                f"(goal ≤ 1.2: {_verdict(ratio <= 1.2)})"
            )
    if f.scenario.name == "S4" and ref:
        for c in (c.name for c in CONTENDERS if c.tailguard):
            if c in f.medians:
                ratio = f.medians[c] / ref
                lines.append(
                    f"{c} / best plain ({f.best_plain}) = {ratio:.2f} "
                    f"(goal ≤ 1.15: {_verdict(ratio <= 1.15)})"
                )
    if f.scenario.shape == "skew":
        checked = [
            x
            for x in runs
            if x["scenario"] == f.scenario.name
            and x["contender"] == SERVICES_CONTENDER
            and x.get("skewed_subtask")
        ]
        hit = [x for x in checked if x["skewed_subtask"]["speculated"]]
        others = sum(len(x["skewed_subtask"]["speculated_subtasks"]) for x in checked) - len(hit)
        if checked:
            sk = checked[0]["skewed_subtask"]
            lines.append(
                f"skewed subtask ({sk['vertex']} #{sk['subtask']}, "
                f"{sk['input_bytes'] / 1024:.0f} KiB in): speculated in {len(hit)} of "
                f"{len(checked)} tailguard+services runs (goal 0: {_verdict(not hit)}); "
                f"speculative launches for other subtasks: {others}"
            )
    return lines


def latencies(runs: Sequence[Run]) -> dict[str, list[float]]:
    mine = [x for x in runs if x["contender"] == SERVICES_CONTENDER and x["ok"]]
    return {
        "slow Tick → LaunchSpeculativeAttempts answered (applied or rejected)": [
            float(s["to_answered"])
            for x in mine
            for s in x["speculation_latency_ms"]
            if s.get("to_answered") is not None
        ],
        "slow Tick → LaunchSpeculativeAttempts applied": [
            float(s["to_applied"])
            for x in mine
            for s in x["speculation_latency_ms"]
            if s["to_applied"] is not None
        ],
        "slow Tick → speculative AttemptDeploying": [
            float(s["to_deploying"])
            for x in mine
            for s in x["speculation_latency_ms"]
            if s["to_deploying"] is not None
        ],
        "last input AttemptFinished → VertexInitialized (decider)": [
            float(d["ms"]) for x in mine for d in x["decider_latency_ms"]
        ],
    }


def markdown(runs: Sequence[Run], scenario_names: Sequence[str], header: Mapping[str, str]) -> str:
    parts = [f"{k}: {v}  " for k, v in header.items()]
    for name in scenario_names:
        f = figures(runs, SCENARIOS[name])
        parts += ["", f"### {name}: {f.scenario.title}", "", f.table]
        if f.goals:
            parts += [""] + [f"- {g}" for g in f.goals]
    parts += [
        "",
        "### Control-plane latency (tailguard+services runs, embedded broker)",
        "",
        report.latency_table(latencies(runs)),
    ]
    return "\n".join(parts) + "\n"
