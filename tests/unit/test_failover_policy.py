"""The failover core: FLIP-1's region restart and backtracking, restart strategies."""

from __future__ import annotations

import pytest
from failover_history import AgentSim

from tailguard.failover.policy import FailoverStrategy
from tailguard.failover.policy.backoff import (
    ExponentialDelayRestart,
    FailureRateRestart,
    FixedDelayRestart,
)
from tailguard.model.config import Settings
from tailguard.model.ids import derived_id
from tailguard.model.records import (
    CancelReason,
    Distribution,
    EdgeSpec,
    ErrorKind,
    Exchange,
    FailJob,
    InputRange,
    JobGraphSpec,
    PartitionRef,
    Record,
    RestartTasks,
    SubtaskInputs,
    TaskRef,
    VertexKind,
    VertexSpec,
)

A2A, FWD = Distribution.ALL_TO_ALL, Distribution.FORWARD
BLOCKING, PIPELINED = Exchange.BLOCKING, Exchange.PIPELINED


def spec(vertices: str, *edges: tuple[str, str, Distribution, Exchange]) -> JobGraphSpec:
    return JobGraphSpec(
        tuple(VertexSpec(v, VertexKind.OPERATOR) for v in vertices),
        tuple(EdgeSpec(s, t, d, x) for s, t, d, x in edges),
    )


def reads(producer: str, subpartitions: tuple[int, int], partitions: tuple[int, int] = (0, 0)):
    return InputRange(producer, partitions[0], partitions[1], subpartitions[0], subpartitions[1])


def restart_of(out: list[Record]) -> RestartTasks:
    assert len(out) == 1 and isinstance(out[0], RestartTasks), out
    return out[0]


def tasks(out: list[Record]) -> set[str]:
    """Flink's notation: subtask k of vertex C is C(k+1)."""
    return {f"{t.vertex}{t.subtask + 1}" for t in restart_of(out).tasks}


# --------------------------------------------------------------------------- FLIP-1's example

# FLIP-1 phase 2's backtracking example: four failover regions A, B, C, D joined by blocking
# partitions; B feeds C and D. C's two subtasks form one region (here through a pipelined sink
# S), as in the seed's "C1 and C2 at the very least must be rescheduled". B writes four
# subpartitions: C1 reads 0, C2 reads 1, D reads 2..3 — so a partition of B that C1 reports
# missing can still be intact for D (the seed's "required result partition" per consumer).
FLIP1_JOB = spec(
    "ABCSD",
    ("A", "B", A2A, BLOCKING),
    ("B", "C", A2A, BLOCKING),
    ("C", "S", A2A, PIPELINED),
    ("B", "D", A2A, BLOCKING),
)
B_CHECKSUMS = ("b0", "b1", "b2", "b3")


def flip1_running(mode: str = "unless-checksum-matches", d_finished: bool = False) -> AgentSim:
    """A and B finished; C1, C2, S1 and D1 running (or D1 finished)."""
    sim = AgentSim(FLIP1_JOB, config={"failover.restart-consumers": mode})
    sim.init("A", 1)
    sim.run("A", 0, ("a0",))
    sim.init("B", 1, (SubtaskInputs(0, (reads("A", (0, 0)),)),))
    sim.run("B", 0, B_CHECKSUMS)
    sim.init("C", 2, tuple(SubtaskInputs(k, (reads("B", (k, k)),)) for k in range(2)))
    sim.init("S", 1)
    sim.init("D", 1, (SubtaskInputs(0, (reads("B", (2, 3)),)),))
    for vertex, subtask in (("C", 0), ("C", 1), ("S", 0)):
        sim.deploy(vertex, subtask)
    sim.deploy("D", 0)
    if d_finished:
        sim.finish("D", 0, 0, ("d0",))
    return sim


def test_flip1_input_still_available_restarts_only_the_failed_region() -> None:
    sim = flip1_running()
    out = sim.fail("C", 0, 0)
    assert tasks(out) == {"C1", "C2", "S1"}


def test_flip1_backtracks_upstream_while_inputs_are_unavailable() -> None:
    sim = flip1_running()
    # The node holding A's and B's partitions is lost.
    sim.release("A", 0, 0)
    sim.release("B", 0, 0)
    out = sim.fail("C", 0, 0, ErrorKind.PARTITION_MISSING, PartitionRef("B", 0, 0))
    # D is running and its input is gone too (case 2), so it restarts at once.
    assert tasks(out) == {"A1", "B1", "C1", "C2", "S1", "D1"}


def test_flip1_backtracking_stops_at_an_available_partition() -> None:
    sim = flip1_running()
    sim.release("B", 0, 0)
    out = sim.fail("C", 0, 0, ErrorKind.PARTITION_MISSING, PartitionRef("B", 0, 0))
    assert tasks(out) == {"B1", "C1", "C2", "S1", "D1"}


@pytest.mark.parametrize("d_finished", [False, True], ids=["case1-running", "case3-finished"])
def test_flip1_cases_1_and_3_always_restart_d(d_finished: bool) -> None:
    """FLIP-1's default: D restarts whenever an upstream region restarts, whatever its state."""
    sim = flip1_running(mode="always", d_finished=d_finished)
    out = sim.fail("C", 0, 0, ErrorKind.PARTITION_MISSING, PartitionRef("B", 0, 0))
    assert tasks(out) == {"B1", "C1", "C2", "S1", "D1"}


@pytest.mark.parametrize("d_finished", [False, True], ids=["case1-running", "case3-finished"])
def test_flip1_cases_1_and_3_defer_d_until_checksums_compare(d_finished: bool) -> None:
    sim = flip1_running(d_finished=d_finished)
    # C1's subpartition of B is missing; what D reads (2..3) is intact.
    out = sim.fail("C", 0, 0, ErrorKind.PARTITION_MISSING, PartitionRef("B", 0, 0))
    assert tasks(out) == {"B1", "C1", "C2", "S1"}
    sim.apply(out[0])
    attempt = sim.deploy("B", 0)
    # B is deterministic: D's subpartitions come out the same, so D keeps its result.
    assert sim.finish("B", 0, attempt, B_CHECKSUMS) == []
    assert sim.core.metrics()["deferred_matched"] == 1


@pytest.mark.parametrize("d_finished", [False, True], ids=["case1-running", "case3-finished"])
def test_flip1_deferred_consumer_restarts_when_its_data_changed(d_finished: bool) -> None:
    sim = flip1_running(d_finished=d_finished)
    out = sim.fail("C", 0, 0, ErrorKind.PARTITION_MISSING, PartitionRef("B", 0, 0))
    sim.apply(out[0])
    attempt = sim.deploy("B", 0)
    # Non-deterministic partitioning: records moved into D's subpartition 3.
    finished = sim.finish("B", 0, attempt, ("b0", "b1", "b2", "b3-changed"))
    command = restart_of(finished)
    assert tasks(finished) == {"D1"}
    assert command.not_before_ts == sim.ts
    assert command.id == derived_id("failover", sim.events[-1].id, "consumers")
    assert set(command.caused_by) == {sim.events[-1].id, out[0].caused_by[0]}


def test_flip1_case2_restarts_running_d_at_once_even_with_checksums() -> None:
    sim = flip1_running()
    sim.release("B", 0, 0)
    out = sim.fail("C", 0, 0, ErrorKind.PARTITION_MISSING, PartitionRef("B", 0, 0))
    assert "D1" in tasks(out)
    assert "A1" not in tasks(out)


def test_changes_outside_what_the_consumer_reads_do_not_restart_it() -> None:
    sim = flip1_running(d_finished=True)
    out = sim.fail("C", 0, 0, ErrorKind.PARTITION_CORRUPT, PartitionRef("B", 0, 0))
    sim.apply(out[0])
    attempt = sim.deploy("B", 0)
    assert sim.finish("B", 0, attempt, ("b0-new", "b1-new", "b2", "b3")) == []


def test_consumers_not_yet_scheduled_are_left_alone() -> None:
    sim = AgentSim(spec("AB", ("A", "B", A2A, BLOCKING)))
    sim.init("A", 2)
    sim.run("A", 0)
    attempt = sim.deploy("A", 1)
    sim.init("B", 1)
    assert tasks(sim.fail("A", 1, attempt)) == {"A2"}


# --------------------------------------------------------------------------- regions


def test_a_pipelined_region_restarts_as_a_whole_and_nothing_else() -> None:
    job = spec("ABC", ("A", "B", FWD, PIPELINED), ("B", "C", A2A, BLOCKING))
    sim = AgentSim(job)
    sim.init("A", 2)
    sim.init("B", 2)
    sim.init("C", 1)
    attempts = {(v, k): sim.deploy(v, k) for v in "AB" for k in range(2)}
    out = sim.fail("B", 1, attempts[("B", 1)])
    command = restart_of(out)
    assert command.tasks == (TaskRef("A", 1), TaskRef("B", 1))
    assert command.id == derived_id("failover", sim.events[-1].id, "restart")
    assert command.caused_by == (sim.events[-1].id,)
    assert command.ts == sim.ts


def test_all_blocking_restarts_only_the_failed_subtask() -> None:
    sim = AgentSim(spec("AB", ("A", "B", A2A, BLOCKING)))
    sim.init("A", 3)
    for k in range(3):
        sim.run("A", k)
    sim.init("B", 2)
    sim.deploy("B", 0)
    attempt = sim.deploy("B", 1)
    assert restart_of(sim.fail("B", 1, attempt)).tasks == (TaskRef("B", 1),)


# --------------------------------------------------------------------------- not failovers


def two_attempts() -> tuple[AgentSim, int, int]:
    sim = AgentSim(spec("A"))
    sim.init("A", 1)
    first = sim.deploy("A", 0)
    second = sim.deploy("A", 0, speculative=True)
    return sim, first, second


def test_no_restart_while_another_attempt_lives() -> None:
    sim, first, second = two_attempts()
    assert sim.fail("A", 0, first) == []
    assert tasks(sim.fail("A", 0, second)) == {"A1"}


def test_failure_of_a_race_loser_is_not_a_failover() -> None:
    sim, first, second = two_attempts()
    sim.finish("A", 0, second)
    assert sim.fail("A", 0, first) == []
    assert sim.core.metrics()["failovers"] == 0
    assert sim.core.metrics()["ignored_failures"] == 1


def test_failure_of_a_cancelled_attempt_is_not_a_failover() -> None:
    sim = AgentSim(spec("A"))
    sim.init("A", 1)
    only = sim.deploy("A", 0)
    sim.cancel("A", 0, only, CancelReason.JOB_CANCELED)
    assert sim.fail("A", 0, only) == []
    assert sim.core.metrics()["failovers"] == 0


def test_failures_of_attempts_retired_by_a_restart_are_ignored() -> None:
    job = spec("AB", ("A", "B", FWD, PIPELINED))
    sim = AgentSim(job)
    sim.init("A", 1)
    sim.init("B", 1)
    a, b = sim.deploy("A", 0), sim.deploy("B", 0)
    out = sim.fail("B", 0, b)
    assert tasks(out) == {"A1", "B1"}
    # The agent has not cancelled A's old attempt yet when it fails too.
    assert sim.fail("A", 0, a) == []
    sim.apply(out[0])
    new_a, new_b = sim.deploy("A", 0), sim.deploy("B", 0)
    assert tasks(sim.fail("A", 0, new_a)) == {"A1", "B1"}
    assert new_b > b


def test_unknown_jobs_and_vertices_are_ignored() -> None:
    sim = AgentSim(spec("A"))
    assert sim.fail("Z", 0, 0) == []  # a vertex the graph does not have
    assert sim.fail("A", 0, 0) == []  # not initialised yet
    other = FailoverStrategy(Settings())
    assert other.handle(sim.events[-1]) == []


def test_state_is_dropped_when_the_job_finishes() -> None:
    sim = AgentSim(spec("A"))
    sim.init("A", 1)
    sim.deploy("A", 0)
    assert sim.core.metrics()["jobs"] == 1
    sim.end()
    assert sim.core.metrics()["jobs"] == 0
    assert sim.fail("A", 0, 0) == []


# --------------------------------------------------------------------------- restart strategies


def failing_repeatedly(config: dict[str, str], times: list[int]) -> list[list[Record]]:
    """One subtask that fails at each of `times`, redeployed after every restart."""
    sim = AgentSim(spec("A"), config=config)
    sim.init("A", 1)
    outputs = []
    for at in times:
        attempt = sim.deploy("A", 0)
        out = sim.fail("A", 0, attempt, at=at)
        outputs.append(out)
        if out and isinstance(out[0], RestartTasks):
            sim.apply(out[0])
    return outputs


def test_fixed_delay_allows_n_restarts_then_fails_the_job() -> None:
    config = {
        "restart-strategy.type": "fixed-delay",
        "restart-strategy.fixed-delay.attempts": "2",
        "restart-strategy.fixed-delay.delay": "3 s",
    }
    outputs = failing_repeatedly(config, [10_000, 20_000, 30_000])
    assert [restart_of(o).not_before_ts for o in outputs[:2]] == [13_000, 23_000]
    (fail,) = outputs[2]
    assert isinstance(fail, FailJob)
    assert "fixed-delay" in fail.reason and "attempts=2" in fail.reason
    assert fail.id == derived_id("failover", fail.caused_by[0], "fail-job")


def test_failure_rate_fails_on_too_many_failures_within_the_interval() -> None:
    config = {
        "restart-strategy.type": "failure-rate",
        "restart-strategy.failure-rate.max-failures-per-interval": "2",
        "restart-strategy.failure-rate.failure-rate-interval": "1 min",
        "restart-strategy.failure-rate.delay": "500 ms",
    }
    # Spread out: never more than two failures in a minute.
    spread = failing_repeatedly(config, [0, 40_000, 80_000, 120_000])
    assert [restart_of(o).not_before_ts for o in spread] == [500, 40_500, 80_500, 120_500]
    dense = failing_repeatedly(config, [0, 10_000, 20_000])
    (fail,) = dense[2]
    assert isinstance(fail, FailJob)
    assert "failure-rate" in fail.reason and "max-failures-per-interval=2" in fail.reason


def test_exponential_delay_grows_caps_and_fails_after_its_attempts() -> None:
    config = {
        "restart-strategy.type": "exponential-delay",
        "restart-strategy.exponential-delay.initial-backoff": "1 s",
        "restart-strategy.exponential-delay.max-backoff": "5 s",
        "restart-strategy.exponential-delay.backoff-multiplier": "2",
        "restart-strategy.exponential-delay.attempts-before-reset-backoff": "4",
    }
    times = [0, 10_000, 20_000, 30_000, 40_000]
    outputs = failing_repeatedly(config, times)
    delays = [restart_of(o).not_before_ts - t for o, t in zip(outputs[:4], times, strict=False)]
    assert delays == [1000, 2000, 4000, 5000]
    (fail,) = outputs[4]
    assert isinstance(fail, FailJob)
    assert "exponential-delay" in fail.reason and "attempts-before-reset-backoff=4" in fail.reason


def test_none_fails_at_the_first_failure() -> None:
    (outputs,) = failing_repeatedly({"restart-strategy.type": "none"}, [5])
    assert isinstance(outputs[0], FailJob)


def test_after_fail_job_the_core_stays_quiet() -> None:
    sim = AgentSim(spec("A"), config={"restart-strategy.type": "none"})
    sim.init("A", 2)
    a0, a1 = sim.deploy("A", 0), sim.deploy("A", 1)
    assert isinstance(sim.fail("A", 0, a0)[0], FailJob)
    assert sim.fail("A", 1, a1) == []


def test_one_failover_counts_once_however_many_regions_restart() -> None:
    config = {
        "restart-strategy.type": "fixed-delay",
        "restart-strategy.fixed-delay.attempts": "1",
    }
    sim = AgentSim(spec("AB", ("A", "B", A2A, PIPELINED)), config=config)
    sim.init("A", 3)
    sim.init("B", 3)
    attempts = {(v, k): sim.deploy(v, k) for v in "AB" for k in range(3)}
    out = sim.fail("A", 0, attempts[("A", 0)])
    assert len(restart_of(out).tasks) == 6
    assert sim.core.metrics()["failovers"] == 1


def test_exponential_delay_merges_failures_during_a_pending_restart_and_resets() -> None:
    backoff = ExponentialDelayRestart(1000, 60_000, 2.0, 10_000, 3)
    assert backoff.on_failure(0) == 1000
    assert backoff.on_failure(500) == 1000  # joins the pending restart, not counted
    assert backoff.on_failure(2000) == 4000
    assert backoff.on_failure(5000) == 9000
    assert backoff.on_failure(9001) is None  # a fourth restart in a row
    fresh = ExponentialDelayRestart(1000, 60_000, 2.0, 10_000, 3)
    assert fresh.on_failure(0) == 1000
    assert fresh.on_failure(2000) == 4000
    assert fresh.on_failure(4000 + 10_000) == 15_000  # quiet for the threshold: reset


def test_failure_rate_and_fixed_delay_arithmetic() -> None:
    rate = FailureRateRestart(1, 1000, 0)
    assert rate.on_failure(0) == 0
    assert rate.on_failure(1001) == 1001  # the previous failure is older than the interval
    assert rate.on_failure(1500) is None
    fixed = FixedDelayRestart(0, 10)
    assert fixed.on_failure(0) is None


def test_a_bad_job_setting_falls_back_to_the_defaults() -> None:
    sim = AgentSim(spec("A"), config={"restart-strategy.type": "sometimes"})
    sim.init("A", 1)
    attempt = sim.deploy("A", 0)
    out = sim.fail("A", 0, attempt)
    assert restart_of(out).not_before_ts == sim.ts + 1000  # exponential-delay's initial backoff
    assert sim.core.metrics()["config_errors"] == 1


def test_a_failover_in_a_wide_all_to_all_job_is_fast() -> None:
    """Consumers of a re-produced partition are found per partition, not per producer x
    consumer pair: 4,000 x 4,000 all-to-all, one lost partition."""
    n = 4000
    sim = AgentSim(spec("AB", ("A", "B", A2A, BLOCKING)))
    sim.init("A", n)
    checksums = tuple(f"c{i}" for i in range(n // 10))
    for k in range(n):
        sim.run("A", k, checksums)
    sim.init(
        "B",
        n,
        tuple(SubtaskInputs(k, (reads("A", (k // 10, k // 10), (0, n - 1)),)) for k in range(n)),
    )
    for k in range(n):
        sim.deploy("B", k)
    out = sim.fail("B", 0, 0, ErrorKind.PARTITION_MISSING, PartitionRef("A", 5, 0))
    # B[0..9] read subpartition 0, which B[0] reported missing: they cannot finish.
    assert tasks(out) == {"A6"} | {f"B{k}" for k in range(1, 11)}
    assert sim.core.metrics()["deferred_checks"] == n - 10
    sim.apply(out[0])
    redone = sim.finish("A", 5, sim.deploy("A", 5), (*checksums[:-1], "changed"))
    assert {t.subtask for t in restart_of(redone).tasks} == set(range(n - 10, n))
