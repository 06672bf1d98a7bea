"""Who may command a job (`model.authority`): the permission table, the id rule, and the reasons
the driver rejects a command with for where it came from."""

from __future__ import annotations

from typing import Any

import pytest

from tailguard.model import records as r
from tailguard.model.authority import (
    AGENT,
    NOT_PERMITTED,
    PERMITTED,
    UNAUTHENTICATED,
    Signed,
    Unauthentic,
    Unchecked,
    authority_problem,
    is_authority_rejection,
    permission_problem,
)

BASE: dict[str, Any] = {"job_id": "job", "ts": 1}


def make(kind: type[r.Command], issuer: str) -> r.Command:
    """A command of `kind` whose id names `issuer`, as `derived_id` would."""
    fields: dict[str, dict[str, Any]] = {
        "LaunchSpeculativeAttempts": {"vertex": "v", "subtask": 0, "count": 1},
        "BlockNodes": {"hosts": ("h1",), "until_ts": 9},
        "UnblockNodes": {"hosts": ("h1",)},
        "SetParallelism": {"vertex": "v", "parallelism": 1, "subtask_inputs": ()},
        "RestartTasks": {"tasks": (r.TaskRef("v", 0),), "reason": "x", "not_before_ts": 0},
        "FailJob": {"reason": "x"},
    }
    return kind(**BASE, id=f"{issuer}-0123abcd", **fields[kind.__name__])


# Each service and the command types it alone may send.
TABLE = {
    "speculator": {r.LaunchSpeculativeAttempts},
    "blocklist": {r.BlockNodes, r.UnblockNodes},
    "decider": {r.SetParallelism},
    "failover": {r.RestartTasks, r.FailJob},
}
SERVICES = ("detector", "speculator", "blocklist", "decider", "failover")


def test_the_table_names_every_command_type_once() -> None:
    assert {s: set(kinds) for s, kinds in PERMITTED.items()} == TABLE
    owners = [kind for kinds in PERMITTED.values() for kind in kinds]
    assert sorted(k.__name__ for k in owners) == sorted(k.__name__ for k in r.COMMAND_TYPES)


@pytest.mark.parametrize("signer", SERVICES)
@pytest.mark.parametrize("kind", r.COMMAND_TYPES)
def test_a_service_may_send_exactly_its_own_commands(signer: str, kind: type[r.Command]) -> None:
    problem = permission_problem(signer, make(kind, signer))
    allowed = kind in TABLE.get(signer, set())
    assert (problem is None) == allowed, problem


def test_fail_job_is_accepted_only_from_failover() -> None:
    for signer in ("speculator", "blocklist", "decider"):
        assert permission_problem(signer, make(r.FailJob, signer)) == (
            f"FailJob is accepted only from failover, not {signer}"
        )
    assert permission_problem("detector", make(r.FailJob, "detector")) == (
        "'detector' issues no commands"
    )
    assert permission_problem("failover", make(r.FailJob, "failover")) is None


def test_a_service_may_not_sign_a_command_whose_id_names_another() -> None:
    # Replay attributes a decision to the service its id names: the two must agree.
    assert permission_problem("blocklist", make(r.FailJob, "failover")) == (
        "signed by blocklist but its id names 'failover'"
    )


def test_an_unknown_signer_issues_nothing() -> None:
    assert permission_problem("mallory", make(r.FailJob, "mallory")) == (
        "'mallory' issues no commands"
    )


@pytest.mark.parametrize(
    ("kind", "issuer", "allowed"),
    [
        (r.SetParallelism, "decider", True),
        (r.RestartTasks, "failover", True),
        (r.FailJob, "failover", True),
        # What the agent has no fallback for, it may not sign.
        (r.LaunchSpeculativeAttempts, "speculator", False),
        (r.BlockNodes, "blocklist", False),
        # A fallback kind, but under the wrong service's id.
        (r.SetParallelism, "failover", False),
    ],
)
def test_the_agent_signs_only_what_it_stands_in_for(
    kind: type[r.Command], issuer: str, allowed: bool
) -> None:
    assert (permission_problem(AGENT, make(kind, issuer)) is None) == allowed


def test_the_agent_may_not_sign_under_an_id_of_its_own() -> None:
    problem = permission_problem(AGENT, make(r.FailJob, "agent"))
    assert problem == (
        "the agent signs only the decisions it takes for decider and failover, "
        "not an id naming 'agent'"
    )


def test_authority_problem_by_origin() -> None:
    fail = make(r.FailJob, "failover")
    # Signing off: every command goes on to its guard, as before signing existed.
    assert authority_problem(fail, Unchecked()) is None
    assert authority_problem(fail, Unauthentic("unsigned (no x)")) == (
        UNAUTHENTICATED + "unsigned (no x)"
    )
    assert authority_problem(fail, Signed("failover", "k1")) is None
    assert authority_problem(fail, Signed("blocklist", "k1")) == (
        NOT_PERMITTED + "signed by blocklist but its id names 'failover'"
    )


def test_rejections_for_authority_are_told_from_the_guards() -> None:
    def rejected(reason: str) -> r.CommandRejected:
        return r.CommandRejected(
            **BASE, id="job-e1", command_id="c", command_type="FailJob", reason=reason
        )

    assert is_authority_rejection(rejected(UNAUTHENTICATED + "unsigned"))
    assert is_authority_rejection(rejected(NOT_PERMITTED + "FailJob is accepted only from"))
    assert not is_authority_rejection(rejected("unknown host(s) ['h9']"))
