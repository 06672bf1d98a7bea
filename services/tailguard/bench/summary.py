"""From the raw runs to the figures and the markdown report (pure: no Spark, no I/O)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tailguard.bench import report, skew_join
from tailguard.bench.scenarios import (
    ATTACH_CONTENDER,
    BENCH_POLICY,
    CONTENDERS,
    IO_FULL,
    NO_SKEW_SPLIT_CONTENDER,
    PLAIN_CONTENDERS,
    PYSPARK_CONTENDER,
    ROW_ORDER,
    SCENARIOS,
    SECOND_JOB,
    SERVICES_CONTENDER,
    TAILGUARD_CONTENDERS,
    TUNED_SPECULATION_CONTENDER,
    IoSize,
    Scenario,
)
from tailguard.model.config import parse_duration_ms

Run = Mapping[str, Any]  # one run as stored in the JSON (`RunRecord` as a dict)

# The targets, per scenario: (contenders, ratio to the best plain contender, to the limit)
HEALTHY_IO_GOAL = 1.05
SLOW_IO_GOAL = 0.9
SLOW_IO_LIMIT_GOAL = 1.15
CPU_SALES_GOAL = 1.1
# Issue 23's targets for attach mode (`make bench-attach`), every rep.
ATTACH_SLOW_VS_BEST_GOAL = 1.0
ATTACH_SLOW_VS_PLAIN_GOAL = 0.9
ATTACH_HEALTHY_GOAL = 1.02
SECOND_JOB_COST_GOAL_S = 0.5
# Issue 24's targets for tailguard's own jobs with the services (I/O mode).
SLOW_COST_VS_SPARK_GOAL = 1.25  # the slow node's cost, against the best Spark contender's
SLOW_VS_SPARK_GOAL = 0.95  # every rep, against the best Spark contender of the same round
LOST_WORK_GOAL = 0.5  # of the tuned speculation's, every rep (attach mode's target too)
HEALTHY_VS_SPARK_GOAL = 1.0
FINDING_INTERVALS_GOAL = 3.0  # first slow-host verdict after the host's first report, median
# Issue 27's targets for the skewed join (io-join-skew), medians and every rep.
SKEW_VS_UNSPLIT_GOAL = 0.6
SKEW_VS_AQE_GOAL = 1.0


@dataclass
class ScenarioFigures:
    scenario: Scenario
    medians: dict[str, float]
    best_plain: str | None
    ideal_s: float | None
    limit_s: float | None
    table: str
    goals: list[str] = field(default_factory=list)


def _ok(runs: Sequence[Run], scenario: str, contender: str) -> list[Run]:
    return [
        x for x in runs if x["scenario"] == scenario and x["contender"] == contender and x["ok"]
    ]


def _ok_times(runs: Sequence[Run], scenario: str, contender: str) -> list[float]:
    return [float(x["job_s"]) for x in _ok(runs, scenario, contender)]


def io_limit(scenario: Scenario, io: IoSize) -> report.IoLimit:
    mine = scenario.io_size(io)
    return report.io_limit(
        mine.tasks,
        mine.task_s,
        mine.workers,
        scenario.slow_factor,
        scenario.slow_for_s,
        scenario.slow_after_s,
        mine.stages,
    )


def figures(runs: Sequence[Run], scenario: Scenario, io: IoSize = IO_FULL) -> ScenarioFigures:
    name = scenario.name
    rows = []
    medians: dict[str, float] = {}
    present = {x["contender"] for x in runs if x["scenario"] == name}
    for c in (c for c in ROW_ORDER if c in present):
        mine = [x for x in runs if x["scenario"] == name and x["contender"] == c]
        ok = [x for x in mine if x["ok"]]
        times = [float(x["job_s"]) for x in ok]
        if times:
            medians[c] = report.spread(times).median
        rows.append(
            report.Row(
                c,
                times,
                [x.get("speculative_attempts") for x in ok],
                [None if c in PLAIN_CONTENDERS else len(x["blocked_hosts"]) for x in ok],
                failed=len(mine) - len(ok),
                load=[float(x["load_after"]) for x in mine if x.get("load_after") is not None],
                lost_copy_s=[x.get("lost_copy_s") for x in ok],
                cpu_s=[x.get("cpu_s") for x in ok],
            )
        )
    plain = {c: medians[c] for c in PLAIN_CONTENDERS if c in medians}
    best_plain = min(plain, key=plain.__getitem__) if plain else None
    extra: dict[str, float | None] = {}
    ideal = None
    if scenario.healthy:
        healthy = [
            report.spread(t).median
            for c in CONTENDERS
            if (t := _ok_times(runs, scenario.healthy, c.name))
        ]
        ideal = min(healthy) if healthy else None
        extra[f"ideal: best median on a healthy cluster ({scenario.healthy})"] = ideal
    limit = None
    if scenario.shape == "io-skew":
        k = skew_join.SKEW_SIZE
        limit = skew_join.limit_s(k, io.workers)
        extra[
            f"physical limit: {k.work_s:g} s of waits on {io.workers} hosts, the hot key cut "
            f"into {k.splits} pieces, no overhead"
        ] = limit
    elif scenario.mode == "io":
        bounds = io_limit(scenario, io)
        limit = bounds.tasks_s
        size = scenario.io_size(io)
        stages = "" if size.stages == 1 else f"{size.stages} stages of "
        extra[
            f"physical limit: {stages}{size.tasks} indivisible {size.task_s:g} s tasks on "
            f"{size.workers} hosts, no overhead"
        ] = limit
        extra["fluid bound: total work / capacity"] = bounds.fluid_s
        if SECOND_JOB in present:
            extra[
                f"physical limit with the slow host blocked: {io.tasks} tasks on "
                f"{io.workers - 1} hosts"
            ] = report.io_limit(io.tasks, io.task_s, io.workers - 1).tasks_s
    table = report.scenario_table(rows, best_plain, extra)
    out = ScenarioFigures(scenario, medians, best_plain, ideal, limit, table)
    out.goals = goals(out, runs)
    return out


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _vs_best_plain(
    f: ScenarioFigures, contenders: Sequence[str], goal: float, op: str
) -> list[str]:
    ref = f.medians.get(f.best_plain) if f.best_plain else None
    if not ref:
        return []
    lines = []
    for c in contenders:
        if c in f.medians:
            ratio = f.medians[c] / ref
            ok = ratio < goal if op == "<" else ratio <= goal
            lines.append(
                f"{c} / best plain ({f.best_plain}) = {ratio:.2f} "
                f"(goal {op} {goal:g}: {_verdict(ok)})"
            )
    return lines


def goals(f: ScenarioFigures, runs: Sequence[Run]) -> list[str]:
    s = f.scenario
    lines = []
    if s.mode == "io" and not s.has_slow_node:
        lines += _vs_best_plain(f, TAILGUARD_CONTENDERS, HEALTHY_IO_GOAL, "≤")
    if s.mode == "io" and s.slow_throughout:
        lines += _vs_best_plain(f, (SERVICES_CONTENDER,), SLOW_IO_GOAL, "≤")
        tg = f.medians.get(SERVICES_CONTENDER)
        if tg is not None and f.limit_s:
            ratio = tg / f.limit_s
            lines.append(
                f"{SERVICES_CONTENDER} / physical limit = {ratio:.2f} "
                f"(goal ≤ {SLOW_IO_LIMIT_GOAL:g}: {_verdict(ratio <= SLOW_IO_LIMIT_GOAL)})"
            )
    if s.mode == "io" and SERVICES_CONTENDER in f.medians:
        lines += slow_node_goals(f, runs)
    if s.shape == "sales" and not s.has_slow_node:
        lines += _vs_best_plain(f, TAILGUARD_CONTENDERS, CPU_SALES_GOAL, "≤")
    if s.mode == "io" and any(
        x["scenario"] == s.name and x["contender"] == ATTACH_CONTENDER for x in runs
    ):
        # Printed when the attached runs failed too: every target says met or NOT met.
        lines += attach_goals(f, runs)
    if s.shape == "skew":
        lines += _skew_goal(f, runs)
    if s.shape == "io-skew":
        lines += skew_join_goals(f, runs)
    return lines


def skew_join_goals(f: ScenarioFigures, runs: Sequence[Run]) -> list[str]:
    """Issue 27's targets for the skewed join: tailguard with splitting ≤ 0.6x itself without,
    and ≤ 1.0x plain PySpark with AQE's skew join, on the medians and in every rep; and how
    many pieces the hot subpartition became in each run."""
    s, tg, lines = f.scenario, SERVICES_CONTENDER, []
    for other, goal in (
        (NO_SKEW_SPLIT_CONTENDER, SKEW_VS_UNSPLIT_GOAL),
        (PYSPARK_CONTENDER, SKEW_VS_AQE_GOAL),
    ):
        if tg not in f.medians or other not in f.medians:
            lines.append(f"{tg} / {other}: not both ran (goal ≤ {goal:g}: NOT met)")
            continue
        ratio = f.medians[tg] / f.medians[other]
        lines.append(
            f"{tg} / {other} = {ratio:.2f} on the medians (goal ≤ {goal:g}: "
            f"{_verdict(ratio <= goal)})"
        )
        lines.append(_every_rep(f"{tg} / {other}", _paired(runs, s.name, tg, other, "job_s"), goal))
    for c in (tg, NO_SKEW_SPLIT_CONTENDER):
        pieces = [x.get("skew_pieces") for x in _ok(runs, s.name, c)]
        if pieces:
            shown = ", ".join("–" if p is None else str(p) for p in pieces)
            lines.append(f"{c}: the hot subpartition's pieces, per run: {shown}")
    return lines


def _skew_goal(f: ScenarioFigures, runs: Sequence[Run]) -> list[str]:
    checked = [
        x
        for x in runs
        if x["scenario"] == f.scenario.name
        and x["contender"] == SERVICES_CONTENDER
        and x.get("skewed_subtask")
    ]
    if not checked:
        return []
    hit = [x for x in checked if x["skewed_subtask"]["speculated"]]
    others = sum(len(x["skewed_subtask"]["speculated_subtasks"]) for x in checked) - len(hit)
    sk = checked[0]["skewed_subtask"]
    return [
        f"skewed subtask ({sk['vertex']} #{sk['subtask']}, "
        f"{sk['input_bytes'] / 1024:.0f} KiB in): speculated in {len(hit)} of "
        f"{len(checked)} tailguard+services runs (goal 0: {_verdict(not hit)}); "
        f"speculative launches for other subtasks: {others}"
    ]


def _by_rep(runs: Sequence[Run], scenario: str, contender: str) -> dict[int, Run]:
    return {int(x.get("run_index", 0)): x for x in _ok(runs, scenario, contender)}


def _every_rep(label: str, values: Sequence[float], goal: float, unit: str = "") -> str:
    """One target over every rep: each rep's figure, met only if every rep meets it."""
    if not values:
        return f"{label}: no rep to compare (goal ≤ {goal:g}{unit}: NOT met)"
    shown = ", ".join(f"{v:.2f}{unit}" for v in values)
    met = all(v <= goal for v in values)
    return f"{label}, per rep: {shown} (goal ≤ {goal:g}{unit} every rep: {_verdict(met)})"


def _paired(runs: Sequence[Run], scenario: str, a: str, b: str, key: str) -> list[float]:
    """Per rep in which both ran: a's `key` over b's (runs interleaved: the same round)."""
    mine, theirs = _by_rep(runs, scenario, a), _by_rep(runs, scenario, b)
    return [
        float(mine[i][key]) / float(theirs[i][key])
        for i in sorted(mine.keys() & theirs.keys())
        if mine[i].get(key) is not None and theirs[i].get(key)
    ]


def attach_goals(f: ScenarioFigures, runs: Sequence[Run]) -> list[str]:
    """Issue 23's targets for the attached job, each rep against the same round's run."""
    s, a = f.scenario, ATTACH_CONTENDER
    if not s.has_slow_node:
        return [
            _every_rep(
                f"healthy: {a} / {PYSPARK_CONTENDER}",
                _paired(runs, s.name, a, PYSPARK_CONTENDER, "job_s"),
                ATTACH_HEALTHY_GOAL,
            )
        ]
    if not s.slow_throughout:
        return []
    best = f.best_plain
    lines = [
        _every_rep(
            f"slow node: {a} / the best Spark contender ({best or 'none ran'})",
            _paired(runs, s.name, a, best, "job_s") if best else [],
            ATTACH_SLOW_VS_BEST_GOAL,
        )
    ]
    lines.append(
        _every_rep(
            f"slow node: {a} / {PYSPARK_CONTENDER}",
            _paired(runs, s.name, a, PYSPARK_CONTENDER, "job_s"),
            ATTACH_SLOW_VS_PLAIN_GOAL,
        )
    )
    lines.append(_lost_work_goal(runs, s.name))
    lines += _second_job_goal(runs, s.name)
    outcome = [float(ms) for x in _ok(runs, s.name, a) for ms in x.get("relay_to_outcome_ms") or ()]
    lines.append(f"{a}: {report.relay_to_outcome_line(outcome)}")
    return lines


def check_interval_ms() -> int:
    """The detector's check interval in the bench's settings."""
    return parse_duration_ms(BENCH_POLICY["slow-task-detector.check-interval"])


def slow_node_goals(f: ScenarioFigures, runs: Sequence[Run]) -> list[str]:
    """Issue 24's targets for tailguard with the services: on a healthy cluster no slower than
    the best Spark contender and no host blocked; with a slow node, a cost (its slow median
    minus its own healthy median) within 1.25x of the best Spark contender's, every rep within
    0.95x of it, half the tuned speculation's extra work, and the slow host found within three
    check intervals of its first progress report."""
    s, tg, best = f.scenario, SERVICES_CONTENDER, f.best_plain
    mine = _ok(runs, s.name, tg)
    if not s.has_slow_node:
        blocked = [x for x in mine if x.get("blocked_hosts")]
        lines = _vs_best_plain(f, (tg,), HEALTHY_VS_SPARK_GOAL, "≤")
        hosts = sorted({h for x in blocked for h in x["blocked_hosts"]})
        lines.append(
            f"{tg}: a host blocked in {len(blocked)} of {len(mine)} healthy runs"
            + (f" ({', '.join(hosts)})" if hosts else "")
            + f" (goal 0: {_verdict(not blocked)})"
        )
        return lines
    lines = []
    if best and s.healthy:
        costs = {
            c: f.medians[c] - report.spread(h).median
            for c in (tg, best)
            if c in f.medians and (h := _ok_times(runs, s.healthy, c))
        }
        if len(costs) == 2 and costs[best] > 0:
            ratio = costs[tg] / costs[best]
            lines.append(
                f"slow node's cost (slow median - own healthy median): {tg} {costs[tg]:+.2f} s, "
                f"{best} {costs[best]:+.2f} s: {ratio:.2f}x (goal ≤ {SLOW_COST_VS_SPARK_GOAL:g}x:"
                f" {_verdict(ratio <= SLOW_COST_VS_SPARK_GOAL)})"
            )
        else:
            shown = ", ".join(f"{c} {v:+.2f} s" for c, v in costs.items()) or "no healthy runs"
            lines.append(
                f"slow node's cost: {shown}; no ratio to the best Spark contender "
                f"(goal ≤ {SLOW_COST_VS_SPARK_GOAL:g}x: NOT met)"
            )
        lines.append(
            _every_rep(
                f"slow node: {tg} / the best Spark contender ({best})",
                _paired(runs, s.name, tg, best, "job_s"),
                SLOW_VS_SPARK_GOAL,
            )
        )
    lines.append(_lost_work_goal(runs, s.name, tg))
    found = [float(x["slow_host_found_ms"]) for x in mine if x.get("slow_host_found_ms")]
    interval = check_interval_ms()
    if found:
        median = report.spread(found).median / interval
        lines.append(
            f"{tg}: slow host found {median:.1f} check intervals ({interval} ms) after its first "
            f"progress report, median of {len(found)} of {len(mine)} runs (spread "
            f"{min(found):.0f}-{max(found):.0f} ms) (goal ≤ {FINDING_INTERVALS_GOAL:g}: "
            f"{_verdict(median <= FINDING_INTERVALS_GOAL and len(found) == len(mine))})"
        )
    else:
        lines.append(
            f"{tg}: the slow host was never named slow in {len(mine)} runs "
            f"(goal ≤ {FINDING_INTERVALS_GOAL:g} check intervals: NOT met)"
        )
    return lines


def _lost_work_goal(runs: Sequence[Run], scenario: str, a: str = ATTACH_CONTENDER) -> str:
    tuned = TUNED_SPECULATION_CONTENDER
    mine, theirs = _by_rep(runs, scenario, a), _by_rep(runs, scenario, tuned)
    pairs = [
        (float(mine[i]["lost_copy_s"]), float(theirs[i]["lost_copy_s"]))
        for i in sorted(mine.keys() & theirs.keys())
        if mine[i].get("lost_copy_s") is not None and theirs[i].get("lost_copy_s") is not None
    ]
    label = f"extra work (task-s of copies that lost): {a} against {tuned}"
    if not pairs:
        return f"{label}: no rep to compare (goal ≤ {LOST_WORK_GOAL:g}×: NOT met)"
    shown = ", ".join(f"{x:.1f} s vs {y:.1f} s" for x, y in pairs)
    met = all(x <= LOST_WORK_GOAL * y for x, y in pairs)
    return f"{label}, per rep: {shown} (goal ≤ {LOST_WORK_GOAL:g}× every rep: {_verdict(met)})"


def _second_job_goal(runs: Sequence[Run], scenario: str) -> list[str]:
    """The second application on the cluster, the host still slow: was the host on the fleet
    list when it started, did any of its tasks go there, and what did the slow host cost it
    against the attached job's healthy median."""
    seconds = [x for x in runs if x["scenario"] == scenario and x["contender"] == SECOND_JOB]
    if not seconds:
        return []
    healthy_scenario = SCENARIOS[scenario].healthy
    healthy = _ok_times(runs, healthy_scenario, ATTACH_CONTENDER) if healthy_scenario else []
    lines = []
    for x in sorted(seconds, key=lambda x: int(x.get("run_index", 0))):
        listed = x["slow_host"] in (x.get("fleet_listed") or ())
        where = (
            f"slow host {x['slow_host']} {'on' if listed else 'NOT on'} the fleet list at start, "
            f"{x.get('slow_host_tasks')} of its tasks there"
        )
        rep = int(x.get("run_index", 0)) + 1
        if not x["ok"] or not healthy:
            lines.append(
                f"second job, rep {rep}: {where}; cost not measured "
                f"({x.get('error') or 'no attached healthy run'}) (goal ≤ "
                f"{SECOND_JOB_COST_GOAL_S:g} s: NOT met)"
            )
            continue
        reference = report.spread(healthy).median
        cost = float(x["job_s"]) - reference
        met = listed and x.get("slow_host_tasks") == 0 and cost <= SECOND_JOB_COST_GOAL_S
        lines.append(
            f"second job, rep {rep}: {where}; {float(x['job_s']):.1f} s against the attached "
            f"healthy median {reference:.1f} s: pays {cost:+.1f} s (goal: starts with the host "
            f"blocked and pays ≤ {SECOND_JOB_COST_GOAL_S:g} s: {_verdict(met)})"
        )
    return lines


def dispatch_samples(runs: Sequence[Run]) -> tuple[list[float], list[float]]:
    """Every tailguard attempt's dispatch overhead and deploy → running time, all runs."""
    mine = [x for x in runs if x["contender"] in TAILGUARD_CONTENDERS and x["ok"]]
    return (
        [float(v) for x in mine for v in x.get("dispatch_ms") or ()],
        [float(v) for x in mine for v in x.get("deploy_to_running_ms") or ()],
    )


def latencies(runs: Sequence[Run]) -> dict[str, list[float]]:
    mine = [x for x in runs if x["contender"] == SERVICES_CONTENDER and x["ok"]]
    dispatch, to_running = dispatch_samples(runs)
    return {
        "dispatch: deploy → outcome round trip minus run time (tailguard, all runs)": dispatch,
        "deploy sent → attempt running (tailguard, all runs)": to_running,
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
        "attach: command at the relay → Spark's answer (applied or rejected)": [
            float(ms) for x in runs if x["ok"] for ms in x.get("relay_to_outcome_ms") or ()
        ],
    }


def markdown(
    runs: Sequence[Run],
    scenario_names: Sequence[str],
    header: Mapping[str, str],
    io: IoSize = IO_FULL,
) -> str:
    parts = [f"{k}: {v}  " for k, v in header.items()]
    for name in scenario_names:
        f = figures(runs, SCENARIOS[name], io)
        parts += ["", f"### {name}: {f.scenario.title}", "", f.table]
        if f.goals:
            parts += [""] + [f"- {g}" for g in f.goals]
    dispatch, _ = dispatch_samples(runs)
    parts += [
        "",
        "### Dispatch and control-plane latency (embedded broker)",
        "",
        report.latency_table(latencies(runs)),
        "",
        *[f"- {g}" for g in report.dispatch_goals(dispatch)],
    ]
    return "\n".join(parts) + "\n"
