"""The run assertions on made-up results: they pass on what happened and, when they fail, say
what happened instead."""

from __future__ import annotations

from pathlib import Path

import pytest

from tailguard.agent.driver.result import AttemptSummary, RunResult
from tailguard.model.config import Settings
from tailguard.testing import (
    JobRun,
    assert_blocked,
    assert_not_blocked,
    assert_not_speculated,
    assert_speculated,
    assert_succeeded,
)

HEAD = "sales→score→partial"


def attempt(vertex: str, subtask: int, number: int, host: str, **fields: object) -> AttemptSummary:
    values: dict = {"speculative": False, "status": "FINISHED", "won": True, "duration_ms": 10}
    values.update(fields)
    return AttemptSummary(vertex, subtask, number, host, **values)


def made_up_run(*attempts: AttemptSummary, **fields: object) -> JobRun:
    values: dict = {
        "job_id": "job-1",
        "status": "SUCCEEDED",
        "message": "",
        "started_ms": 0,
        "finished_ms": 1_000,
        "attempts": attempts,
        "parallelism": {HEAD: (2, "decider")},
        "outputs": {},
        "archive": None,
        "chains": {HEAD: ("sales", "score", "partial"), "final→sink": ("final", "sink")},
    }
    values.update(fields)
    return JobRun(None, RunResult(**values), Settings(), Path("."))  # type: ignore[arg-type]


SPECULATED = made_up_run(
    attempt(HEAD, 0, 0, "127.0.0.2"),
    attempt(HEAD, 1, 0, "127.0.0.4", status="CANCELED", won=False, cancel_reason="LOST_RACE"),
    attempt(HEAD, 1, 1, "127.0.0.3", speculative=True),
    attempt("final→sink", 0, 0, "127.0.0.2"),
    blocked=(("127.0.0.4", 1_000, 21_000),),
)


def test_speculation_found_by_operator_or_chain_and_subtask() -> None:
    (copy,) = assert_speculated(SPECULATED, "score", subtask=1, won=True)
    assert (copy.vertex, copy.attempt, copy.host) == (HEAD, 1, "127.0.0.3")
    assert_speculated(SPECULATED, HEAD)
    assert_speculated(SPECULATED)
    assert_not_speculated(SPECULATED, "final")
    assert_not_speculated(SPECULATED, "score", subtask=0)


def test_a_missing_speculation_names_the_ones_that_ran() -> None:
    with pytest.raises(AssertionError) as err:
        assert_speculated(SPECULATED, "final", subtask=0)
    message = str(err.value)
    assert "no speculative attempt of final#0 (chain final→sink) ran" in message
    assert f"{HEAD}#1 speculative attempt 1 on 127.0.0.3: FINISHED (won)" in message


def test_an_unwanted_speculation_is_listed() -> None:
    with pytest.raises(AssertionError) as err:
        assert_not_speculated(SPECULATED, "partial")
    assert "expected no speculative attempt of partial (chain sales→score→partial)" in str(
        err.value
    )
    assert "speculative attempt 1 on 127.0.0.3" in str(err.value)
    with pytest.raises(AssertionError, match="expected none of them to win"):
        assert_speculated(SPECULATED, "score", won=False)


def test_unknown_vertex_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"no vertex 'scroe'.*operators: final, partial, sales"):
        assert_speculated(SPECULATED, "scroe")


def test_blocked_hosts() -> None:
    assert assert_blocked(SPECULATED, "127.0.0.4") == [("127.0.0.4", 1_000, 21_000)]
    assert_not_blocked(SPECULATED, "127.0.0.2")
    with pytest.raises(AssertionError) as err:
        assert_blocked(SPECULATED, "127.0.0.3")
    assert "127.0.0.3 was never blocked" in str(err.value)
    assert "127.0.0.4 for 20.0 s" in str(err.value)
    with pytest.raises(AssertionError, match=r"(?s)every host to stay unblocked.*127\.0\.0\.4"):
        assert_not_blocked(SPECULATED)


def test_a_failed_job_shows_its_failed_attempts() -> None:
    failed = made_up_run(
        attempt(HEAD, 0, 0, "127.0.0.2", status="FAILED", won=False, error="ValueError: bad row\n"),
        status="FAILED",
        message="restart limit",
    )
    with pytest.raises(AssertionError) as err:
        assert_succeeded(failed)
    assert "FAILED in 1.0 s (restart limit)" in str(err.value)
    assert f"{HEAD}#0 attempt 0 on 127.0.0.2: FAILED: ValueError: bad row" in str(err.value)
    assert_succeeded(SPECULATED)
