"""The one command intake (issue 26, item 2): one table of forged, unauthorised, duplicate and
genuine commands, sent in order through the intake alone, through the owned driver's command
applier (its inbox, as the Kafka adapter posts them) and through attach mode's `Actuation` (as the
relay hands them over). All three give the same verdicts: a forgery is answered with
`CommandRejected` and its reason and uses up no id; a genuine command is taken once; its id
again is answered by nothing."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from agent_fakes import Harness, one_subtask_job
from test_agent_commands import answers

from tailguard.agent.driver.ports import CommandReceived
from tailguard.model import records as r
from tailguard.model.authority import AGENT, Origin, Signed, Unauthentic, Unchecked
from tailguard.model.command_intake import Admitted, CommandIntake, Duplicate, Rejected, Verdict
from tailguard.model.config import Settings
from tailguard.observer.actuation import Actuation
from tailguard.observer.translate import SparkEventTranslator

UNSIGNED = Unauthentic("unsigned (no tailguard.signature header)")
WRONG_KEY = Unauthentic("signature does not match (claims signer 'blocklist')")
BLOCKLIST = Signed("blocklist", "k1")


def unblock(job_id: str, cid: str) -> r.UnblockNodes:
    # The host is in both actuators' applications and blocked in neither: each guard lets the
    # command through, so what a row sees is the intake's verdict alone.
    return r.UnblockNodes(job_id=job_id, ts=1, id=cid, hosts=("h1",))


def fail(job_id: str, cid: str) -> r.FailJob:
    return r.FailJob(job_id=job_id, ts=1, id=cid, reason="forged")


# In order, on one actuator: (command maker, id, origin, the verdict).
Row = tuple[Callable[[str, str], r.Command], str, Origin, Verdict]
TABLE: list[Row] = [
    (unblock, "blocklist-1", UNSIGNED, Rejected("unauthenticated: " + UNSIGNED.reason)),
    (unblock, "blocklist-1", WRONG_KEY, Rejected("unauthenticated: " + WRONG_KEY.reason)),
    (
        unblock,
        "blocklist-1",
        Signed("speculator", "k1"),
        Rejected("not permitted: signed by speculator but its id names 'blocklist'"),
    ),
    (
        fail,
        "blocklist-2",
        BLOCKLIST,
        Rejected("not permitted: FailJob is accepted only from failover, not blocklist"),
    ),
    (
        unblock,
        "blocklist-3",
        Signed(AGENT, "k1"),
        Rejected(
            "not permitted: the agent signs only the decisions it takes for decider and "
            "failover, not an id naming 'blocklist'"
        ),
    ),
    (
        fail,
        "failover-1",
        Signed("nobody", "k1"),
        Rejected("not permitted: 'nobody' issues no commands"),
    ),
    # The forgeries used up nothing: the blocklist's own command with that id is taken, once.
    (unblock, "blocklist-1", BLOCKLIST, Admitted()),
    (unblock, "blocklist-1", BLOCKLIST, Duplicate()),
    # A forgery of an id already handled is still answered, and still changes nothing.
    (unblock, "blocklist-1", UNSIGNED, Rejected("unauthenticated: " + UNSIGNED.reason)),
    (unblock, "blocklist-1", BLOCKLIST, Duplicate()),
    # Signing off: every command is taken, once.
    (unblock, "anyone-1", Unchecked(), Admitted()),
    (unblock, "anyone-1", Unchecked(), Duplicate()),
]


def _expected() -> list[Verdict]:
    return [verdict for *_, verdict in TABLE]


def _command(row: Row, job_id: str) -> r.Command:
    make, cid, _, _ = row
    return make(job_id, cid)


def test_the_intake_alone() -> None:
    intake = CommandIntake()
    assert [intake.take(_command(row, "job"), row[2]) for row in TABLE] == _expected()


def test_a_fallback_claims_an_id_the_intake_then_calls_a_duplicate() -> None:
    intake = CommandIntake(handled=["failover-0"])
    assert intake.claim("decider-1") and not intake.claim("decider-1")
    assert intake.take(fail("job", "failover-0"), Signed("failover", "k")) == Duplicate()
    intake.restore(["failover-2"])
    assert intake.take(fail("job", "failover-2"), Signed("failover", "k")) == Duplicate()


# --------------------------------------------------------------------------- the owned driver


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[Harness]:
    h = one_subtask_job(tmp_path).start()
    yield h
    h.stop()


def _driver_verdict(h: Harness, command: r.Command, origin: Origin) -> Verdict:
    before = len(answers(h, command.id))
    h.post(CommandReceived(command, origin))  # returns once the driver has handled it
    new = answers(h, command.id)[before:]
    if not new:
        return Duplicate()
    [(kind, said)] = new
    return Admitted() if kind == "CommandApplied" else Rejected(said)


def test_the_owned_driver_gives_the_tables_verdicts(driver: Harness) -> None:
    job_id = driver.driver.job_id
    seen = [_driver_verdict(driver, _command(row, job_id), row[2]) for row in TABLE]
    assert seen == _expected()
    assert not driver.finished  # the forged FailJobs reached no guard


# --------------------------------------------------------------------------- attach mode

APP = "app-7"
T0 = 1_000_000


def _actuation() -> tuple[Actuation, io.BytesIO]:
    translator = SparkEventTranslator()
    for line in (
        ["A", str(T0), APP, "sales"],
        ["X", str(T0), "1", "h1", "1"],
        ["X", str(T0), "2", "h2", "1"],
        ["J", str(T0), "0", "1"],
        ["G", "0", "4", "2", "", "scan"],
    ):
        translator.handle(line)
    channel = io.BytesIO()
    return Actuation(translator, Settings({}), channel), channel


def _attach_verdict(
    actuation: Actuation, channel: io.BytesIO, command: r.Command, origin: Origin
) -> Verdict:
    written = len(channel.getvalue())
    events = actuation.received(command, origin, T0 + 100)
    if any(isinstance(e, r.CommandApplied) for e in events) or len(channel.getvalue()) > written:
        return Admitted()
    if not events:
        return Duplicate()
    [rejected] = events
    assert isinstance(rejected, r.CommandRejected)
    return Rejected(rejected.reason)


def test_attach_mode_gives_the_tables_verdicts() -> None:
    actuation, channel = _actuation()
    job_id = f"{APP}-job-0"
    seen = [_attach_verdict(actuation, channel, _command(row, job_id), row[2]) for row in TABLE]
    assert seen == _expected()
    assert channel.getvalue() == b""  # the forged FailJobs reached no guard, nor the JVM
