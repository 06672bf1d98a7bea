"""Errors that recur wherever the task runs fail the job without using up the restart strategy
(Flink's `ExecutionFailureHandler` with `ThrowableType.NonRecoverableError`): an import error,
and the same USER error of one subtask from two hosts. The failover service and the agent's
local fallback decide alike."""

from __future__ import annotations

import pytest
from failover_history import AgentSim

from tailguard.agent.driver.fallbacks import LocalFallbacks
from tailguard.agent.executor.attempt import recurs_anywhere
from tailguard.model.config import Settings
from tailguard.model.records import (
    ErrorKind,
    FailJob,
    JobGraphSpec,
    Record,
    RestartTasks,
    VertexKind,
    VertexSpec,
)

GRAPH = JobGraphSpec((VertexSpec("A", VertexKind.OPERATOR),), ())
RESTARTS = {"restart-strategy.type": "fixed-delay", "restart-strategy.fixed-delay.attempts": "5"}


def started() -> AgentSim:
    sim = AgentSim(GRAPH, config=RESTARTS)
    sim.init("A", 1)
    return sim


def only(out: list[Record], kind: type) -> Record:
    assert len(out) == 1 and isinstance(out[0], kind), out
    return out[0]


def restart_again(sim: AgentSim, out: list[Record]) -> None:
    sim.apply(only(out, RestartTasks))


def test_an_import_error_fails_the_job_at_once_without_a_restart() -> None:
    sim = started()
    attempt = sim.deploy("A", 0, host="h1")
    out = sim.fail(
        "A", 0, attempt, message="ModuleNotFoundError: No module named 'geo'", non_recoverable=True
    )
    fail = only(out, FailJob)
    assert isinstance(fail, FailJob)
    assert "not recoverable" in fail.reason and "No module named 'geo'" in fail.reason
    metrics = sim.core.metrics()
    assert (metrics["failovers"], metrics["non_recoverable_failures"]) == (0, 1)
    # The restart strategy was never consulted: its count of failures is untouched.
    assert sim.core.jobs["job-1"].backoff.failures == 0  # type: ignore[attr-defined]


def test_an_import_error_fails_the_job_even_with_a_copy_still_running() -> None:
    sim = started()
    first = sim.deploy("A", 0, host="h1")
    sim.deploy("A", 0, speculative=True, host="h2")
    only(sim.fail("A", 0, first, message="ImportError: x", non_recoverable=True), FailJob)


def test_the_same_user_error_on_a_second_host_fails_the_job() -> None:
    sim = started()
    restart_again(sim, sim.fail("A", 0, sim.deploy("A", 0, host="h1"), message="KeyError: 'x'"))
    fail = only(sim.fail("A", 0, sim.deploy("A", 0, host="h2"), message="KeyError: 'x'"), FailJob)
    assert isinstance(fail, FailJob)
    assert "the same error on 2 hosts (h1, h2)" in fail.reason
    assert sim.core.metrics()["failovers"] == 1  # only the first failure used a restart


def test_the_same_error_on_one_host_keeps_restarting_until_the_strategy_says_no() -> None:
    sim = AgentSim(GRAPH, config={**RESTARTS, "restart-strategy.fixed-delay.attempts": "2"})
    sim.init("A", 1)
    for _ in range(2):
        restart_again(sim, sim.fail("A", 0, sim.deploy("A", 0, host="h1"), message="KeyError"))
    fail = only(sim.fail("A", 0, sim.deploy("A", 0, host="h1"), message="KeyError"), FailJob)
    assert isinstance(fail, FailJob) and "restart-strategy fixed-delay" in fail.reason


@pytest.mark.parametrize(
    ("second_message", "error"),
    [
        ("KeyError: 'y'", ErrorKind.USER),  # another error: may be the host's after all
        ("KeyError: 'x'", ErrorKind.INFRA),  # not the user's code: the host may be to blame
    ],
)
def test_other_errors_on_a_second_host_restart(second_message: str, error: ErrorKind) -> None:
    sim = started()
    restart_again(sim, sim.fail("A", 0, sim.deploy("A", 0, host="h1"), message="KeyError: 'x'"))
    out = sim.fail("A", 0, sim.deploy("A", 0, host="h2"), error, message=second_message)
    only(out, RestartTasks)


def test_a_speculative_copy_failing_alike_on_another_host_fails_the_job() -> None:
    sim = started()
    first = sim.deploy("A", 0, host="h1")
    copy = sim.deploy("A", 0, speculative=True, host="h2")
    assert sim.fail("A", 0, first, message="ValueError: bad row 17") == []  # the copy may win
    only(sim.fail("A", 0, copy, message="ValueError: bad row 17"), FailJob)


def test_a_cancelled_attempt_is_no_evidence() -> None:
    from tailguard.model.records import CancelReason

    sim = started()
    first = sim.deploy("A", 0, host="h1")
    copy = sim.deploy("A", 0, speculative=True, host="h2")
    sim.cancel("A", 0, copy, CancelReason.LOST_RACE)
    assert sim.fail("A", 0, copy, host="h2", message="OSError: interrupted") == []
    only(sim.fail("A", 0, first, host="h1", message="OSError: interrupted"), RestartTasks)


def test_only_import_errors_are_classified_as_recurring_anywhere() -> None:
    assert recurs_anywhere(ModuleNotFoundError("No module named 'geo'"))
    assert recurs_anywhere(ImportError("cannot import name 'f'"))
    assert not recurs_anywhere(ValueError("bad row"))
    assert not recurs_anywhere(OSError("disk full"))


def test_the_local_fallback_decides_as_the_service() -> None:
    """With the services down the agent's failover is the same core: same FailJob, same id."""
    sim = started()
    restart_again(sim, sim.fail("A", 0, sim.deploy("A", 0, host="h1"), message="KeyError: 'x'"))
    sim.fail("A", 0, sim.deploy("A", 0, host="h2"), message="KeyError: 'x'")
    service = [o for o in sim.outputs if isinstance(o, FailJob)]
    fallbacks = LocalFallbacks(Settings(RESTARTS), services=False)
    local: list[Record] = []
    for event in sim.events:
        fallbacks.observe(event)
        local.extend(f.command for f in fallbacks.due(event.ts) if isinstance(f.command, FailJob))
    assert len(service) == 1 and local == service
