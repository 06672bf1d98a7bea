"""Scale simulation: speculation policies compared on one seeded cluster and job.

A discrete-event simulation (time in ms) of a batch job of many tasks in stages separated by
barriers, running in waves on a cluster with a few slow hosts and a few skewed tasks, drawn from
the distributions printed at the top of the output. The same scenario runs under four policies:

- none: no speculation;
- tailguard's real detector, speculator and blocklist cores, fed the agent's events at
  simulated time, their commands applied as the agent would (`sim/tailguard_driver.py`), in
  five contenders: tailguard-flip168 (FLIP-168's rules exactly: Flink's rule, the
  every-slow-attempt blocklist), tailguard (the defaults: Flink's rule and the slow-host rule,
  the evidence-based blocklist), tailguard-flink (Flink's rule and the evidence-based
  blocklist: the defaults before issue 24), tailguard-progress (the progress-rate rule on top)
  and tailguard-progress-lpt (the same, with the agent starting each stage's largest subtasks
  first: scheduler.subtask-order=largest-input-first);
- spark: Spark's speculation rule (quantile 0.75, multiplier 1.5, minTaskRuntime, interval);
- LATE: Zaharia et al., OSDI 2008 (SlowTaskThreshold, SlowNodeThreshold, SpeculativeCap);
- LATE-oracle (a diagnostic, only when named): LATE never copying a task that is only skewed;
- LATE-lpt (a diagnostic, only when named): LATE with the largest tasks started first.

Same seed, same table. Progress goes to stderr.

    .venv/bin/python benchmarks/simulate.py            # 1,000 hosts, 100,000 tasks
    .venv/bin/python benchmarks/simulate.py --quick    # 100 hosts, 10,000 tasks
    .venv/bin/python benchmarks/simulate.py --quick --shapes --seeds 3
        # one row per host-slowness shape and contender (sim/shapes.py)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from sim.baselines import (
    Late,
    LateConfig,
    LateLargestFirst,
    LateOracle,
    NoSpeculation,
    SparkConfig,
    SparkRule,
)
from sim.engine import Outcome, Policy, Simulation
from sim.report import LEGEND, row, seeds_summary, speed, table, trace, trace_lines
from sim.scenario import ScenarioParams, build, describe
from sim.shapes import SHAPE_POLICIES, run_shapes, shapes, shapes_table
from sim.tailguard_driver import SIMULATION_SETTINGS, VARIANTS, TailguardPolicy

# The contenders of a default run, in the table's order.
POLICY_NAMES = ("none", *VARIANTS, "spark", "LATE")
# Diagnostics, run only when named in --policies.
DIAGNOSTICS: dict[str, Callable[[], Policy]] = {
    "LATE-oracle": LateOracle,
    "LATE-lpt": LateLargestFirst,
}
BASELINES: dict[str, Callable[[], Policy]] = {
    "none": NoSpeculation,
    "spark": SparkRule,
    "LATE": Late,
    **DIAGNOSTICS,
}
KNOWN = (*POLICY_NAMES, *DIAGNOSTICS)


def make_policy(name: str, tailguard_settings: dict[str, str] | None = None) -> Policy:
    if name in VARIANTS:
        return TailguardPolicy(tailguard_settings, variant=name)
    if name in BASELINES:
        return BASELINES[name]()
    raise ValueError(f"unknown policy {name!r}; known: {KNOWN}")


def run(
    params: ScenarioParams,
    policies: list[str] | None = None,
    progress: bool = False,
    tailguard_settings: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run the named policies (all by default) on the scenario of `params`; "none" always runs
    first, as the baseline. Returns {"scenario", "rows", "speeds"}."""
    names = ["none", *[p for p in (policies or POLICY_NAMES) if p != "none"]]
    scenario = build(params)
    outcomes: list[Outcome] = []
    printer = _ProgressPrinter(params.tasks) if progress else None
    for name in names:
        policy = make_policy(name, tailguard_settings)
        outcomes.append(Simulation(scenario, policy, printer).run())
        if printer:
            printer.done(outcomes[-1])
    baseline = outcomes[0].completion_ms
    return {
        "scenario": params.to_dict(),
        "tailguard_settings": {**SIMULATION_SETTINGS, **(tailguard_settings or {})},
        "rows": [row(o, None if o.policy == "none" else baseline) for o in outcomes],
        "speeds": [speed(o) for o in outcomes],
        "traces": [trace(o) for o in outcomes],
    }


class _ProgressPrinter:
    def __init__(self, tasks: int) -> None:
        self.tasks = tasks
        self.last = time.perf_counter()

    def __call__(self, policy: str, now_ms: int, finished: int) -> None:
        if time.perf_counter() - self.last < 2:
            return
        self.last = time.perf_counter()
        print(
            f"  … {policy:<18} simulated {now_ms / 1000:>8,.0f} s,"
            f" {finished:>8,}/{self.tasks:,} tasks finished",
            file=sys.stderr,
            flush=True,
        )

    def done(self, outcome: Outcome) -> None:
        print(
            f"  {outcome.policy:<18} done in {outcome.wall_seconds:.1f} s wall",
            file=sys.stderr,
            flush=True,
        )


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, ScenarioParams]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, help="default 1000 (100 with --quick)")
    parser.add_argument("--tasks", type=int, help="default 100000 (10000 with --quick)")
    parser.add_argument("--slots", type=int, default=2, help="slots per host")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--slow-fraction", type=float, default=0.02)
    parser.add_argument("--skew-fraction", type=float, default=0.01)
    parser.add_argument("--policies", default=",".join(POLICY_NAMES), help="comma-separated")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a tailguard setting for this run (repeatable), e.g. --set"
        " execution.batch.speculative.block-slow-node-duration='20 s'",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        default=1,
        metavar="N",
        help="also run seeds seed+1 .. seed+N-1 and print a summary over all N",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the results here")
    parser.add_argument("--quick", action="store_true", help="100 hosts, 10,000 tasks")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    parser.add_argument(
        "--shapes",
        action="store_true",
        help="one scenario per host-slowness shape (5x, 1.5x, 5x from mid-job, 5x for I/O"
        f" only, none), contenders {', '.join(SHAPE_POLICIES)}, over --seeds seeds",
    )
    parser.add_argument(
        "--trace",
        action="store_true",
        help="also print what ended each stage and how long slow-host attempts ran before"
        " their copy started",
    )
    args = parser.parse_args(argv)
    params = ScenarioParams(
        hosts=args.hosts or (100 if args.quick else 1_000),
        tasks=args.tasks or (10_000 if args.quick else 100_000),
        slots=args.slots,
        seed=args.seed,
        slow_fraction=args.slow_fraction,
        skew_fraction=args.skew_fraction,
    )
    return args, params


def main(argv: list[str] | None = None) -> int:
    args, params = parse(argv)
    policies = [p for p in args.policies.split(",") if p]
    unknown = [p for p in policies if p not in KNOWN]
    if unknown:
        print(f"unknown policies {unknown}; known: {list(KNOWN)}", file=sys.stderr)
        return 2
    malformed = [item for item in args.set if "=" not in item]
    if malformed:
        print(f"--set needs KEY=VALUE, got {malformed}", file=sys.stderr)
        return 2
    settings = dict(item.split("=", 1) for item in args.set)
    if args.shapes:
        return _main_shapes(args, params, settings)
    print("scale simulation: speculation policies on one seeded scenario")
    for line in describe(params):
        print(f"  {line}")
    for variant in VARIANTS:
        if variant in policies:
            print(f"  {TailguardPolicy(settings, variant=variant).describe()}")
    print(f"  {SparkConfig().describe()}")
    print(f"  {LateConfig().describe()}")
    print(
        f"reproduce: {sys.executable} benchmarks/simulate.py --hosts {params.hosts}"
        f" --tasks {params.tasks} --slots {params.slots} --seed {params.seed}"
        f" --slow-fraction {params.slow_fraction:g} --skew-fraction {params.skew_fraction:g}",
        flush=True,
    )
    results = run(params, policies, progress=not args.quiet, tailguard_settings=settings)
    print()
    print("\n".join(table(results["rows"])))
    print(LEGEND)
    print()
    print(
        "speculative attempts of skewed tasks (of them: first attempt on a healthy host, i.e."
        " only skewed; of those, won) / of tasks first placed on a slow host:"
    )
    for r in results["rows"]:
        print(
            f"  {r['policy']:<22} {r['speculated_skewed']:>6,} ({r['speculated_skew_only']:,};"
            f" {r['skew_only_wins']:,}) / {r['speculated_on_slow_host']:,}"
        )
    if args.trace:
        for t in results["traces"]:
            print("\n".join(trace_lines(t)))
    print("simulator speed (simulated tasks per wall-clock second):")
    for s in results["speeds"]:
        print(f"  {s['policy']:<22} {s['tasks_per_wall_s']:>9,} tasks/s ({s['wall_s']:.1f} s)")
    if args.seeds > 1:
        runs = {params.seed: results["rows"]}
        for seed in range(params.seed + 1, params.seed + args.seeds):
            print(f"seed {seed} …", file=sys.stderr, flush=True)
            again = run(replace(params, seed=seed), policies, tailguard_settings=settings)
            runs[seed] = again["rows"]
        print(f"over seeds {params.seed}..{params.seed + args.seeds - 1}:")
        print("\n".join(seeds_summary(runs)))
        results["seeds"] = {str(seed): seed_rows for seed, seed_rows in runs.items()}
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


def _main_shapes(args: argparse.Namespace, params: ScenarioParams, settings: dict[str, str]) -> int:
    print("scale simulation: host-slowness shapes, the same contenders on each")
    for name, scenario in shapes(params).items():
        print(f"  {name}: {describe(scenario)[-1].removeprefix('slow      ')}")
    for line in describe(params)[:-1]:
        print(f"  {line}")
    print(f"  {TailguardPolicy(settings, variant='tailguard').describe()}")
    print(f"  {SparkConfig().describe()}")
    print(f"  {LateConfig().describe()}")
    print(
        f"reproduce: {sys.executable} benchmarks/simulate.py --shapes --hosts {params.hosts}"
        f" --tasks {params.tasks} --slots {params.slots} --seed {params.seed}"
        f" --seeds {args.seeds} --slow-fraction {params.slow_fraction:g}"
        f" --skew-fraction {params.skew_fraction:g}",
        flush=True,
    )
    started = time.perf_counter()

    def runner(scenario: ScenarioParams, policies: list[str]) -> list[dict[str, Any]]:
        if not args.quiet:
            print(f"  … seed {scenario.seed}", file=sys.stderr, flush=True)
        rows: list[dict[str, Any]] = run(scenario, policies, tailguard_settings=settings)["rows"]
        return rows

    results = run_shapes(params, args.seeds, runner)
    print()
    print("\n".join(shapes_table(results)))
    print(
        f"means over seeds {params.seed}..{params.seed + args.seeds - 1}; healthy hosts blocked:"
        " the most on any one seed; extra work: simulated seconds run by speculative attempts"
    )
    print(f"wall time {time.perf_counter() - started:,.0f} s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
