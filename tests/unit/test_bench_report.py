"""The pure parts of `tailguard bench`: statistics, the physical limit, latency extraction from a
synthetic record list, and the tables."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tailguard.bench import report, summary
from tailguard.bench.scenarios import (
    ATTACH_CONTENDERS,
    IO_FULL,
    IO_QUICK,
    QUICK_CONTENDERS,
    SCENARIOS,
    select,
    select_contenders,
)
from tailguard.model import records as r

JOB = "job-1"


def test_percentile_interpolates_like_numpy() -> None:
    values = [10.0, 20.0, 30.0, 40.0]
    assert report.percentile(values, 50) == 25.0
    assert report.percentile(values, 0) == 10.0
    assert report.percentile(values, 100) == 40.0
    assert report.percentile(values, 99) == pytest.approx(39.7)
    s = report.spread([3.0, 1.0, 2.0])
    assert (s.median, s.low, s.high, s.n) == (2.0, 1.0, 3.0, 3)
    with pytest.raises(ValueError):
        report.spread([])


def test_physical_limit_whole_job_slow() -> None:
    # 22 slot-seconds over capacity 2 + 1/5 = 2.2 -> 10 s; the longest task (1 s) does not bind.
    stages = [report.StageWork("a", 22.0, 1.0)]
    assert report.physical_limit(stages, 3, 5.0) == pytest.approx(10.0)
    # Healthy: capacity 3.
    assert report.physical_limit(stages, 3, 1.0) == pytest.approx(22.0 / 3)


def test_physical_limit_longest_task_and_stage_barrier() -> None:
    stages = [report.StageWork("a", 2.2, 0.5), report.StageWork("b", 1.0, 4.0)]
    # Stage a: 1 s; stage b cannot end before its 4 s task: 1 + 4.
    assert report.physical_limit(stages, 3, 5.0) == pytest.approx(5.0)


def test_physical_limit_node_recovers() -> None:
    # Slow for 5 s: 11 slot-s done by then, the remaining 9 at capacity 3 -> 3 s more.
    stages = [report.StageWork("a", 20.0, 1.0)]
    assert report.physical_limit(stages, 3, 5.0, slow_for_s=5.0) == pytest.approx(8.0)
    # A second stage that starts after the recovery runs at full capacity.
    two = [report.StageWork("a", 20.0, 1.0), report.StageWork("b", 6.0, 1.0)]
    assert report.physical_limit(two, 3, 5.0, slow_for_s=5.0) == pytest.approx(10.0)


def _deploy(ts: int, vertex: str, subtask: int, attempt: int, **kw: object) -> r.AttemptDeploying:
    return r.AttemptDeploying(
        job_id=JOB,
        ts=ts,
        id=f"d-{vertex}-{subtask}-{attempt}",
        vertex=vertex,
        subtask=subtask,
        attempt=attempt,
        host="h",
        **kw,  # type: ignore[arg-type]
    )


def _finish(
    ts: int, vertex: str, subtask: int, attempt: int, nbytes: int = 100
) -> r.AttemptFinished:
    return r.AttemptFinished(
        job_id=JOB,
        ts=ts,
        id=f"f-{vertex}-{subtask}-{attempt}",
        vertex=vertex,
        subtask=subtask,
        attempt=attempt,
        host="h",
        input_bytes=nbytes,
        records=1,
        bytes_per_subpartition=(),
        checksums=(),
    )


def _finding(ts: int, tick: str, subtask: int, attempts: tuple[int, ...]) -> r.SlowTasksDetected:
    live = tuple(
        r.SlowAttempt(attempt=a, host="h", execution_time_ms=2000, input_bytes=100)
        for a in attempts
    )
    return r.SlowTasksDetected(
        job_id=JOB,
        ts=ts,
        id=f"find-{ts}",
        caused_by=(tick,),
        vertex="v",
        speculation_safe=True,
        baseline_ms=1000,
        baseline_ns_per_byte=None,
        slow=(r.SlowSubtask(subtask=subtask, live_attempts=live, latest_attempt=max(attempts)),),
        hosts=("h",),
    )


def _records() -> list[r.Record]:
    graph = r.JobGraphSpec(
        vertices=(
            r.VertexSpec(name="src", kind=r.VertexKind.SOURCE),
            r.VertexSpec(name="v", kind=r.VertexKind.OPERATOR),
        ),
        edges=(r.EdgeSpec(source="src", target="v", distribution=r.Distribution.FORWARD),),
    )
    launch = r.LaunchSpeculativeAttempts(
        job_id=JOB,
        ts=2_600,
        id="launch-1",
        caused_by=("find-2510",),
        vertex="v",
        subtask=3,
        count=1,
    )
    return [
        r.JobSubmitted(job_id=JOB, ts=0, id="e0", name="job", graph=graph),
        _deploy(100, "src", 0, 0),
        _deploy(100, "src", 1, 0),
        _finish(900, "src", 0, 0),
        _finish(1_100, "src", 1, 0),
        r.VertexInitialized(
            job_id=JOB,
            ts=1_250,
            id="vi",
            vertex="v",
            parallelism=4,
            subtask_inputs=(),
            decided_by="decider",
        ),
        _deploy(1_300, "v", 3, 0),
        r.Tick(job_id=JOB, ts=2_000, id="tick-1"),
        _finding(2_010, "tick-1", 3, (0,)),  # the first Tick at which attempt 0 qualified
        r.Tick(job_id=JOB, ts=2_500, id="tick-2"),
        _finding(2_510, "tick-2", 3, (0,)),
        launch,  # the speculator acted on the second finding only
        r.CommandApplied(
            job_id=JOB,
            ts=2_700,
            id="ca",
            command_id="launch-1",
            command_type="LaunchSpeculativeAttempts",
        ),
        _deploy(2_900, "v", 3, 1, speculative=True, command_id="launch-1"),
        _finish(3_000, "v", 3, 1, nbytes=500),
        _finish(3_100, "v", 3, 0, nbytes=500),
    ]


def test_speculation_latency_from_first_qualifying_tick() -> None:
    [lat] = report.speculation_latencies(_records())
    assert (lat.vertex, lat.subtask) == ("v", 3)
    assert lat.qualified_ms == 2_000
    assert lat.to_applied_ms == 700
    assert lat.to_answered_ms == 700
    assert lat.to_deploying_ms == 900


def test_rejected_launch_counts_as_answered_only() -> None:
    recs = [x for x in _records() if not isinstance(x, (r.CommandApplied, r.AttemptDeploying))]
    recs.append(
        r.CommandRejected(
            job_id=JOB,
            ts=2_800,
            id="cr",
            command_id="launch-1",
            command_type="LaunchSpeculativeAttempts",
            reason="subtask v#3 already finished",
        )
    )
    [lat] = report.speculation_latencies(recs)
    assert (lat.to_answered_ms, lat.to_applied_ms, lat.to_deploying_ms) == (800, None, None)


def test_decider_latency_from_last_input_finished() -> None:
    assert report.decider_latencies(_records()) == [("v", 150)]


def test_stage_work_and_skew_helpers() -> None:
    stages = report.stage_work(_records())
    assert [s.vertex for s in stages] == ["src", "v"]
    assert stages[0].work_s == pytest.approx(0.8 + 1.0)
    assert stages[0].longest_s == pytest.approx(1.0)
    assert stages[1].work_s == pytest.approx(0.1 + 1.8)
    assert report.speculated_subtasks(_records()) == {("v", 3)}
    assert report.largest_input_subtask(_records(), "v") == (3, 500)


def _run(scenario: str, contender: str, t: float, **kw: object) -> dict[str, object]:
    base: dict[str, object] = {
        "scenario": scenario,
        "contender": contender,
        "job_s": t,
        "ok": True,
        "blocked_hosts": [],
        "speculative_attempts": 0,
        "stage_work": [],
        "speculation_latency_ms": [],
        "decider_latency_ms": [],
        "skewed_subtask": None,
        "load_after": 2.0,
    }
    return {**base, **kw}


def test_io_limit_indivisible_tasks_on_a_slow_host() -> None:
    # 36 tasks of 2 s, 6 hosts, one 5x slow: 5 healthy hosts x 7 tasks + 1 task of 10 s on
    # the slow one = 36 at 14 s; the fluid bound 72 / 5.2 is lower.
    lim = report.io_limit(36, 2.0, 6, 5.0)
    assert lim.tasks_s == pytest.approx(14.0)
    assert lim.fluid_s == pytest.approx(72.0 / 5.2)
    # Healthy: 6 waves of 2 s, both bounds agree.
    assert report.io_limit(36, 2.0, 6) == report.IoLimit(12.0, 12.0)
    # The critical path binds: one task cannot finish before 2 s however many hosts there are.
    assert report.io_limit(1, 2.0, 6, 5.0) == report.IoLimit(2.0, 2.0)
    # 18 tasks: 5 x 3 waves = 15 by 6 s, so the slow host's one task (10 s) is not worth it
    # and a 4th wave of 2 s gives 8 s.
    assert report.io_limit(18, 2.0, 6, 5.0).tasks_s == pytest.approx(8.0)


def test_io_limit_host_recovers() -> None:
    # Slow for 6 s: by 14 s the slow host has done 6/5 + 8 = 9.2 s of work (4 tasks), the
    # healthy ones 35; by 12.8 s (its 4th task) the healthy ones have 30: too few.
    lim = report.io_limit(36, 2.0, 6, 5.0, slow_for_s=6.0)
    assert lim.tasks_s == pytest.approx(14.0)
    # Fluid: 6 s at 5.2 = 31.2, the remaining 40.8 at 6 -> 6.8 s more.
    assert lim.fluid_s == pytest.approx(12.8)
    with pytest.raises(ValueError):
        report.io_limit(0, 2.0, 6)


def test_io_limit_node_turns_slow_mid_job() -> None:
    # Healthy for 12 s: all 36 tasks are done by then, so the later slowness costs nothing.
    assert report.io_limit(36, 2.0, 6, 5.0, slow_after_s=12.0).tasks_s == pytest.approx(12.0)
    # From 11 s: the slow host's 6th task (1 s done before, 1 s at 1/5) ends at 16 s; the
    # healthy hosts' 6th wave ends at 12 s with 35 tasks, and their 7th at 14 s.
    assert report.io_limit(36, 2.0, 6, 5.0, slow_after_s=11.0).tasks_s == pytest.approx(14.0)
    # Fluid from 6 s: 36 s of work by 6 s at 6 slots, the other 36 at 5.2.
    lim = report.io_limit(36, 2.0, 6, 5.0, slow_after_s=6.0)
    assert lim.fluid_s == pytest.approx(6.0 + 36.0 / 5.2)
    # Slow from 6 s for 1 s only: 0.2 s of work lost, which the fluid bound spreads.
    brief = report.io_limit(36, 2.0, 6, 5.0, slow_for_s=1.0, slow_after_s=6.0)
    assert brief.fluid_s == pytest.approx(6.0 + 1.0 + (72.0 - 36.0 - 5.2) / 6)


def test_io_limit_several_stages() -> None:
    # Three stages of 36 tasks, healthy: 3 x 12 s.
    assert report.io_limit(36, 2.0, 6, stages=3).tasks_s == pytest.approx(36.0)
    # Slow throughout: each stage 14 s. The slow host's partial work at a stage's start does
    # not carry over into the next stage's tasks.
    assert report.io_limit(36, 2.0, 6, 5.0, stages=3).tasks_s == pytest.approx(42.0)
    # Slow from 12 s: the first stage is healthy (12 s), the next two 14 s each.
    lim = report.io_limit(36, 2.0, 6, 5.0, slow_after_s=12.0, stages=3)
    assert lim.tasks_s == pytest.approx(40.0)
    assert lim.fluid_s == pytest.approx(12.0 + 144.0 / 5.2)
    with pytest.raises(ValueError):
        report.io_limit(36, 2.0, 6, stages=0)


def test_dispatch_line_and_goals() -> None:
    samples = [1.0] * 98 + [3.0, 40.0]
    assert report.dispatch_line(samples) == "dispatch p50 1.0 ms p99 3.4 ms"
    assert report.dispatch_line([]).startswith("dispatch p50 – ms p99 – ms")
    [goal] = report.dispatch_goals(samples)
    assert "p50 1.0 ms (goal ≤ 5: met)" in goal
    assert "p99 3.4 ms (goal ≤ 20: met)" in goal
    [slow] = report.dispatch_goals([30.0, 30.0])
    assert "(goal ≤ 5: NOT met)" in slow and "(goal ≤ 20: NOT met)" in slow


def _slow_run(t: float, load: float, cpu: tuple[float, float, float]) -> dict[str, object]:
    """tailguard+services on io-slow, the slow host blocked, with its CPU by part."""
    return _run(
        "io-slow",
        "tailguard+services",
        t,
        blocked_hosts=["127.0.0.7"],
        load_after=load,
        cpu_s=dict(zip(report.CPU_PARTS, cpu, strict=True)),
    )


def _io_runs() -> list[dict[str, object]]:
    return [
        _run("io-healthy", "tailguard+services", 12.6, dispatch_ms=[0.5, 1.5]),
        _run("io-healthy", "tailguard (no services)", 13.0, dispatch_ms=[2.5]),
        _run("io-healthy", "pyspark", 12.4),
        _run("io-healthy", "pyspark+speculation", 12.2),
        _slow_run(15.0, 3.0, (4.0, 50.0, 2.0)),
        _slow_run(17.0, 5.0, (6.0, 70.0, 3.0)),
        _run("io-slow", "pyspark", 20.0),
        _run("io-slow", "pyspark+speculation", 18.0),
        _run("io-slow", "pyspark", 0.0, ok=False),
    ]


def test_io_tables_limits_and_goals() -> None:
    runs = _io_runs()
    f = summary.figures(runs, SCENARIOS["io-slow"])
    assert f.best_plain == "pyspark+speculation"
    assert f.ideal_s == 12.2
    assert f.limit_s == pytest.approx(14.0)
    assert (
        "| tailguard+services | 16.0 | 15.0–17.0 | 2 | 0.89× | 0.0 | – | 1.0 | 5.0 / 60.0 / 2.5 "
        "| 3.0, 5.0 |"
    ) in f.table
    assert "| pyspark | 20.0 | 20.0–20.0 | 1 (+1 failed) | 1.11× | 0.0 | – | – | – |" in f.table
    assert "| *physical limit: 36 indivisible 2 s tasks on 6 hosts, no overhead* | 14.0 |" in (
        f.table
    )
    assert "| *fluid bound: total work / capacity* | 13.8 | | | | | | | | |" in f.table
    assert "tailguard+services / best plain (pyspark+speculation) = 0.89 (goal ≤ 0.9: met)" in (
        f.goals
    )
    assert "tailguard+services / physical limit = 1.14 (goal ≤ 1.15: met)" in f.goals
    healthy = summary.figures(runs, SCENARIOS["io-healthy"])
    assert healthy.limit_s == pytest.approx(12.0)
    assert healthy.goals == [
        "tailguard+services / best plain (pyspark+speculation) = 1.03 (goal ≤ 1.05: met)",
        "tailguard (no services) / best plain (pyspark+speculation) = 1.07 (goal ≤ 1.05: NOT met)",
        # Issue 24's: no slower than the best Spark contender, no host blocked.
        "tailguard+services / best plain (pyspark+speculation) = 1.03 (goal ≤ 1: NOT met)",
        "tailguard+services: a host blocked in 0 of 1 healthy runs (goal 0: met)",
    ]


def test_slow_node_targets_of_issue_24() -> None:
    tg, tuned, plain = "tailguard+services", "pyspark+speculation(flink-like)", "pyspark"
    runs = [
        _run("io-healthy", tg, 12.0, run_index=0, blocked_hosts=["127.0.0.3"]),
        _run("io-healthy", tg, 12.4, run_index=1),
        _run("io-healthy", tuned, 12.5, run_index=0),
        _run("io-healthy", tuned, 12.5, run_index=1),
        _run("io-healthy", plain, 12.3, run_index=0),
        # Slow: tailguard pays 14.2 - 12.2 = 2.0 s, the tuned speculation 15.0 - 12.5 = 2.5 s.
        _run("io-slow", tg, 14.0, run_index=0, lost_copy_s=1.0, slow_host_found_ms=500.0),
        _run("io-slow", tg, 14.4, run_index=1, lost_copy_s=4.0, slow_host_found_ms=1000.0),
        _run("io-slow", tuned, 15.0, run_index=0, lost_copy_s=6.0),
        _run("io-slow", tuned, 15.0, run_index=1, lost_copy_s=6.0),
        _run("io-slow", plain, 20.0, run_index=0, lost_copy_s=0.0),
    ]
    goals = summary.figures(runs, SCENARIOS["io-slow"]).goals
    assert (
        f"slow node's cost (slow median - own healthy median): {tg} +2.00 s, {tuned} +2.50 s: "
        "0.80x (goal ≤ 1.25x: met)"
    ) in goals
    assert (
        f"slow node: {tg} / the best Spark contender ({tuned}), per rep: 0.93, 0.96 "
        "(goal ≤ 0.95 every rep: NOT met)"
    ) in goals
    assert (
        f"extra work (task-s of copies that lost): {tg} against {tuned}, per rep: "
        "1.0 s vs 6.0 s, 4.0 s vs 6.0 s (goal ≤ 0.5× every rep: NOT met)"
    ) in goals
    # 750 ms median at the bench's 250 ms interval.
    assert any(
        g.startswith(f"{tg}: slow host found 3.0 check intervals (250 ms)")
        and g.endswith("met)")
        and "NOT" not in g
        for g in goals
    ), goals
    healthy = summary.figures(runs, SCENARIOS["io-healthy"]).goals
    assert f"{tg}: a host blocked in 1 of 2 healthy runs (127.0.0.3) (goal 0: NOT met)" in healthy
    # A run in which the host was never named fails the finding target.
    runs[6] = {**runs[6], "slow_host_found_ms": None}
    goals = summary.figures(runs, SCENARIOS["io-slow"]).goals
    assert any("median of 1 of 2 runs" in g and g.endswith("NOT met)") for g in goals), goals


def test_quick_io_size_changes_the_limit() -> None:
    f = summary.figures(_io_runs(), SCENARIOS["io-slow"], IO_QUICK)
    assert f.limit_s == pytest.approx(8.0)
    assert "18 indivisible 2 s tasks" in f.table


def test_cpu_sales_goal_and_markdown_with_dispatch() -> None:
    runs = [
        *_io_runs(),
        _run("cpu-sales", "tailguard+services", 5.0),
        _run("cpu-sales", "pyspark", 4.0),
    ]
    [goal] = summary.figures(runs, SCENARIOS["cpu-sales"]).goals
    assert goal == "tailguard+services / best plain (pyspark) = 1.25 (goal ≤ 1.1: NOT met)"
    dispatch, to_running = summary.dispatch_samples(runs)
    assert sorted(dispatch) == [0.5, 1.5, 2.5] and to_running == []
    text = summary.markdown(runs, ["io-healthy", "io-slow", "cpu-sales"], {"date": "today"})
    assert text.startswith("date: today")
    assert "### io-slow: I/O mode, one node 5x slow for the whole job" in text
    assert "| dispatch: deploy → outcome round trip minus run time (tailguard, all runs) | 3 " in (
        text
    )
    assert "- dispatch overhead p50 1.5 ms (goal ≤ 5: met)" in text


def test_skew_goal_reports_a_speculated_skewed_subtask() -> None:
    skewed = {
        "vertex": "score",
        "subtask": 2,
        "input_bytes": 10240,
        "speculated": True,
        "speculated_subtasks": [2, 5],
    }
    runs = [
        _run("cpu-skew", "tailguard+services", 5.0, skewed_subtask=skewed),
        _run("cpu-skew", "pyspark", 6.0),
    ]
    [goal] = summary.figures(runs, SCENARIOS["cpu-skew"]).goals
    assert "speculated in 1 of 1 tailguard+services runs (goal 0: NOT met)" in goal
    assert "other subtasks: 1" in goal


def test_latency_table_and_selection() -> None:
    table = report.latency_table({"a": [100.0, 200.0, 300.0], "b": []})
    assert "| a | 3 | 200 | 298 | 300 |" in table
    assert "| b | 0 | – | – | – |" in table
    assert [s.name for s in select("io-slow, CPU-sales")] == ["io-slow", "cpu-sales"]
    assert [s.name for s in select(None)] == ["io-healthy", "io-slow", "cpu-sales"]
    with pytest.raises(ValueError, match="unknown scenario"):
        select("S1")
    assert [s.name for s in select(None, ("io-slow",))] == ["io-slow"]


def test_contender_selection_keeps_the_standard_order() -> None:
    names = [c.name for c in select_contenders("pyspark, tailguard+services")]
    assert names == ["tailguard+services", "pyspark"]
    assert [c.name for c in select_contenders(None, QUICK_CONTENDERS)] == list(QUICK_CONTENDERS)
    assert len(select_contenders(None)) == 6
    # make bench-attach: the unmodified job's contenders, attach mode last.
    attach = select_contenders(",".join(ATTACH_CONTENDERS))
    assert [c.name for c in attach] == list(ATTACH_CONTENDERS) and attach[-1].attach
    with pytest.raises(ValueError, match="unknown contender"):
        select_contenders("spark")


def test_tables_list_only_the_contenders_that_ran() -> None:
    runs = [_run("io-slow", "tailguard+services", 15.0), _run("io-slow", "pyspark", 20.0)]
    table = summary.figures(runs, SCENARIOS["io-slow"]).table
    assert "| pyspark | 20.0 |" in table
    assert "pyspark+speculation" not in table and "no services" not in table


def _task(
    stage: int, index: int, status: str, duration_s: float | None, speculative: bool = False
) -> report.SparkTask:
    return report.SparkTask(stage, 0, index, status, speculative, "h", duration_s)


def test_lost_copies_are_the_killed_twins_of_a_success() -> None:
    tasks = [
        _task(1, 0, "SUCCESS", 2.0),
        _task(1, 1, "KILLED", 9.0),  # the original on the slow host, its copy won
        _task(1, 1, "SUCCESS", 2.1, speculative=True),
        _task(1, 2, "SUCCESS", 6.0),
        _task(1, 2, "KILLED", 1.5, speculative=True),  # a copy that lost
        _task(1, 3, "KILLED", 4.0),  # no twin succeeded (a cancelled job): not a lost race
        _task(2, 1, "SUCCESS", 0.5),  # another stage's index 1 is another task
        _task(2, 2, "KILLED", None),
        _task(2, 2, "SUCCESS", 0.4),
    ]
    assert report.lost_copy_s(tasks) == pytest.approx(10.5)
    assert report.lost_copy_s([]) == 0.0
    work = report.spark_stage_work(tasks)
    assert work == [
        report.StageWork("stage-1", pytest.approx(10.1), 6.0),  # type: ignore[arg-type]
        report.StageWork("stage-2", pytest.approx(0.9), 0.5),  # type: ignore[arg-type]
    ]


def _attach_runs(second_s: float = 21.0, lost: float = 1.0) -> list[dict[str, object]]:
    attach, second = "pyspark+tailguard-attach", "pyspark+tailguard-attach, second job"
    tuned = "pyspark+speculation(flink-like)"
    slow = {"slow_host": "127.0.0.7"}
    runs = []
    for i, (a, p, t) in enumerate([(20.4, 20.0, 19.0), (20.2, 20.0, 19.0)]):
        runs += [
            _run("io-healthy", "pyspark", p, run_index=i),
            _run("io-healthy", tuned, t, run_index=i),
            _run("io-healthy", attach, a, run_index=i),
        ]
    for i, (a, p, t) in enumerate([(21.0, 24.0, 22.0), (23.0, 24.0, 22.0)]):
        runs += [
            _run("io-slow", "pyspark", p, run_index=i, lost_copy_s=0.0, **slow),
            _run("io-slow", tuned, t, run_index=i, lost_copy_s=4.0, **slow),
            _run(
                "io-slow",
                attach,
                a,
                run_index=i,
                lost_copy_s=lost,
                relay_to_outcome_ms=[2.0, 4.0],
                blocked_hosts=["127.0.0.7"],
                **slow,
            ),
            _run(
                "io-slow",
                second,
                second_s,
                run_index=i,
                lost_copy_s=0.0,
                slow_host_tasks=0 if i == 0 else 1,
                fleet_listed=["127.0.0.7"],
                **slow,
            ),
        ]
    return runs


def test_attach_targets_every_rep() -> None:
    runs = _attach_runs()
    healthy = summary.figures(runs, SCENARIOS["io-healthy"])
    # The attached contender is not one of Spark's: the best plain is Spark's own.
    assert healthy.best_plain == "pyspark+speculation(flink-like)"
    assert healthy.goals == [
        "healthy: pyspark+tailguard-attach / pyspark, per rep: 1.02, 1.01 "
        "(goal ≤ 1.02 every rep: met)"
    ]
    f = summary.figures(runs, SCENARIOS["io-slow"])
    assert f.best_plain == "pyspark+speculation(flink-like)"
    [best, plain, lost, second_1, second_2, latency] = f.goals
    assert best == (
        "slow node: pyspark+tailguard-attach / the best Spark contender "
        "(pyspark+speculation(flink-like)), per rep: 0.95, 1.05 (goal ≤ 1 every rep: NOT met)"
    )
    assert plain == (
        "slow node: pyspark+tailguard-attach / pyspark, per rep: 0.88, 0.96 "
        "(goal ≤ 0.9 every rep: NOT met)"
    )
    assert lost.endswith("per rep: 1.0 s vs 4.0 s, 1.0 s vs 4.0 s (goal ≤ 0.5× every rep: met)")
    # Healthy attached median 20.3 s: the second job pays 0.7 s; rep 2 also sent a task there.
    assert second_1 == (
        "second job, rep 1: slow host 127.0.0.7 on the fleet list at start, 0 of its tasks "
        "there; 21.0 s against the attached healthy median 20.3 s: pays +0.7 s (goal: starts "
        "with the host blocked and pays ≤ 0.5 s: NOT met)"
    )
    assert "1 of its tasks there" in second_2 and second_2.endswith("NOT met)")
    assert latency == (
        "pyspark+tailguard-attach: command at the relay → Spark's answer p50 3.0 ms, "
        "p99 4.0 ms over 4 commands"
    )
    # The table: the second job's row under the attached run's, the lost copies, and the
    # limit with the host blocked (36 tasks on 5 hosts: 8 waves of 2 s).
    lines = f.table.splitlines()
    names = [line.split(" | ")[0] for line in lines[2:6]]
    assert names == [
        "| pyspark",
        "| pyspark+speculation(flink-like)",
        "| pyspark+tailguard-attach",
        "| pyspark+tailguard-attach, second job",
    ]
    assert "| pyspark+speculation(flink-like) | 22.0 | 22.0–22.0 | 2 | 1.00× | 0.0 | 4.0 | – |" in (
        f.table
    )
    assert "| *physical limit with the slow host blocked: 36 tasks on 5 hosts* | 16.0 |" in (
        f.table
    )


def test_attach_targets_met_and_missing_figures() -> None:
    runs = _attach_runs(second_s=20.5, lost=2.5)
    f = summary.figures(runs, SCENARIOS["io-slow"])
    assert f.goals[2].endswith("(goal ≤ 0.5× every rep: NOT met)")  # 2.5 s > 0.5 x 4.0 s
    assert f.goals[3].endswith(
        "pays +0.2 s (goal: starts with the host blocked and pays ≤ 0.5 s: met)"
    )
    # Without the attached healthy runs the second job's cost cannot be told.
    slow_only = [x for x in runs if x["scenario"] == "io-slow"]
    second = summary.figures(slow_only, SCENARIOS["io-slow"]).goals[3]
    assert "cost not measured (no attached healthy run)" in second and second.endswith("NOT met)")
    assert report.relay_to_outcome_line([]) == "command at the relay → Spark's answer: no command"


def test_second_job_only_after_a_node_slow_throughout() -> None:
    assert SCENARIOS["io-slow"].slow_throughout
    assert not SCENARIOS["io-recovers"].slow_throughout
    assert not SCENARIOS["io-healthy"].slow_throughout


def test_attach_targets_printed_when_every_attached_run_failed() -> None:
    failed = {"ok": False, "job_s": None, "slow_host": "127.0.0.7", "error": "RuntimeError: x"}
    runs = [
        _run("io-slow", "pyspark", 24.0, lost_copy_s=0.0),
        _run("io-slow", "pyspark+speculation(flink-like)", 22.0, lost_copy_s=4.0),
        _run("io-slow", "pyspark+tailguard-attach", 0.0, **failed),
        _run("io-slow", "pyspark+tailguard-attach, second job", 0.0, **failed),
    ]
    goals = summary.figures(runs, SCENARIOS["io-slow"]).goals
    assert len(goals) == 5
    assert all("NOT met" in g for g in goals[:4])
    assert "no rep to compare" in goals[0] and "cost not measured (RuntimeError: x)" in goals[3]
    assert goals[4].endswith("no command")
    alone = [x for x in runs if str(x["contender"]).startswith("pyspark+tailguard-attach")]
    [best, *_] = summary.figures(alone, SCENARIOS["io-slow"]).goals
    assert best.startswith("slow node: pyspark+tailguard-attach / the best Spark contender (none")
    assert best.endswith("NOT met)")


def _progress(ts: int, host: str) -> r.AttemptProgress:
    return r.AttemptProgress(
        job_id=JOB,
        ts=ts,
        id=f"p-{host}-{ts}",
        vertex="v",
        subtask=0,
        attempt=0,
        host=host,
        records_read=1,
        bytes_read=10,
    )


def test_lost_race_seconds_from_the_archive() -> None:
    def cancel(ts: int, subtask: int, attempt: int, reason: r.CancelReason) -> r.AttemptCanceled:
        return r.AttemptCanceled(
            job_id=JOB,
            ts=ts,
            id=f"c-{subtask}-{attempt}",
            vertex="v",
            subtask=subtask,
            attempt=attempt,
            host="h",
            reason=reason,
        )

    records: list[r.Record] = [
        _deploy(1_000, "v", 0, 0),
        _deploy(4_000, "v", 0, 1, speculative=True),
        _deploy(1_000, "v", 1, 0),
        _deploy(2_000, "v", 2, 0),
        _finish(6_000, "v", 0, 1),
        cancel(6_500, 0, 0, r.CancelReason.LOST_RACE),  # the original lost: 5.5 s
        cancel(3_000, 1, 0, r.CancelReason.RESTART),  # not a lost race
        cancel(9_000, 2, 0, r.CancelReason.JOB_CANCELED),
        cancel(9_000, 3, 0, r.CancelReason.LOST_RACE),  # never deployed in this archive
    ]
    assert report.lost_race_s(records) == pytest.approx(5.5)
    assert report.lost_race_s(records[:5]) == 0.0


def test_slow_host_finding_from_the_hosts_first_report() -> None:
    records: list[r.Record] = [
        _progress(900, "fast"),
        _progress(1_000, "slow"),
        _progress(1_500, "slow"),
        _finding(1_700, "t", 0, (0,)),  # a finding with no verdict
        replace(_finding(2_250, "t", 0, (0,)), slow_hosts=("slow",)),
    ]
    assert report.slow_host_finding_ms(records, "slow") == 1_250.0
    assert report.slow_host_finding_ms(records, "fast") is None  # never named
    # Turned slow at 1.2 s, after its first report: counted from then.
    assert report.slow_host_finding_ms(records, "slow", since_ms=1_200) == 1_050.0
    # Turned slow before its first report: counted from the report.
    assert report.slow_host_finding_ms(records, "slow", since_ms=500) == 1_250.0
    assert report.slow_host_finding_ms(records[:4], "slow") is None


def test_turns_slow_and_several_stages_scenarios() -> None:
    turns, stages = SCENARIOS["io-turns-slow"], SCENARIOS["io-stages-slow"]
    assert turns.has_slow_node and not turns.slow_throughout and turns.slow_after_s == 6.0
    assert stages.slow_throughout and SCENARIOS["io-stages-healthy"].healthy is None
    io = stages.io_size(IO_FULL)
    assert (io.stages, io.tasks, io.task_s, io.workers) == (3, 18, 2.0, 6)
    assert turns.io_size(IO_FULL) == IO_FULL
    # Three stages of 18 tasks, slow throughout: 8 s a stage (see the io_limit tests).
    f = summary.figures([_run("io-stages-slow", "pyspark", 30.0)], stages)
    assert f.limit_s == pytest.approx(24.0)
    assert "physical limit: 3 stages of 18 indivisible 2 s tasks on 6 hosts" in f.table
    # Slow from 6 s: 18 tasks done by then, the other 18 by 14 s.
    assert summary.figures([_run("io-turns-slow", "pyspark", 16.0)], turns).limit_s == (
        pytest.approx(14.0)
    )
