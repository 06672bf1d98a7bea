"""The relay's command intake in attach mode, against a translator fed the listener's lines and a
channel that records what the JVM actuator would read: authority first, each id once, the
actuator's answers as CommandApplied/CommandRejected with their effects, the fleet list, and
blocks lifted when their time is up."""

from __future__ import annotations

import io
import logging

import pytest

from tailguard.model import records as r
from tailguard.model.authority import Signed, Unauthentic, Unchecked
from tailguard.model.config import Settings
from tailguard.model.fleet import FleetBlock
from tailguard.observer.actuation import Actuation
from tailguard.observer.translate import SparkEventTranslator

APP = "app-7"
JOB = f"{APP}-job-0"
T0 = 1_000_000


def _app() -> tuple[SparkEventTranslator, list[r.Event]]:
    translator = SparkEventTranslator()
    lines = [
        ["A", str(T0), APP, "sales"],
        ["X", str(T0), "1", "h1", "1"],
        ["X", str(T0), "2", "h2", "1"],
        ["X", str(T0), "3", "h3", "1"],
        ["J", str(T0), "0", "1"],
        ["G", "0", "4", "2", "", "scan"],
        # task 40: stage 4 attempt 0, index 1, partition 1, attempt 0, executor 1 on h1
        ["TS", str(T0 + 10), "40", "4", "0", "1", "1", "0", "1", "h1", "0"],
    ]
    events = [e for line in lines for e in translator.handle(line)]
    return translator, events


def _actuation(**settings: str) -> tuple[Actuation, SparkEventTranslator, io.BytesIO]:
    translator, _ = _app()
    channel = io.BytesIO()
    return Actuation(translator, Settings(settings), channel), translator, channel


def _copy(command_id: str = "speculator-a") -> r.LaunchSpeculativeAttempts:
    return r.LaunchSpeculativeAttempts(
        job_id=JOB, ts=T0 + 100, id=command_id, vertex="stage-4", subtask=1, count=1
    )


def test_a_command_goes_to_the_jvm_once_and_its_answer_is_published() -> None:
    actuation, _, channel = _actuation()
    assert actuation.received(_copy(), Unchecked(), T0 + 200) == []
    assert actuation.received(_copy(), Unchecked(), T0 + 201) == []  # the same id again
    assert channel.getvalue() == b"SPEC\tspeculator-a\t4\t0\t1\n"
    [applied] = actuation.outcome(["CO", "speculator-a", "OK"], T0 + 300)
    assert isinstance(applied, r.CommandApplied) and applied.command_id == "speculator-a"
    assert applied.job_id == JOB and applied.ts == T0 + 300


def test_spark_has_the_last_word() -> None:
    actuation, _, _ = _actuation()
    actuation.received(_copy(), Unchecked(), T0 + 200)
    [rejected] = actuation.outcome(["CO", "speculator-a", "NO", "task 1 already finished"], T0)
    assert isinstance(rejected, r.CommandRejected)
    assert rejected.reason == "task 1 already finished"


def test_a_forgery_is_rejected_before_it_uses_up_the_services_id() -> None:
    actuation, _, channel = _actuation()
    [rejected] = actuation.received(_copy(), Unauthentic("unsigned"), T0 + 200)
    assert isinstance(rejected, r.CommandRejected) and rejected.reason.startswith("unauthentic")
    [wrong] = actuation.received(_copy(), Signed("blocklist", "k1"), T0 + 200)
    assert isinstance(wrong, r.CommandRejected) and wrong.reason.startswith("not permitted")
    assert channel.getvalue() == b""
    # The speculator's own command, with the same id, still goes through.
    assert actuation.received(_copy(), Signed("speculator", "k1"), T0 + 300) == []
    assert channel.getvalue().startswith(b"SPEC\tspeculator-a\t")


def test_a_kind_this_spark_lacks_is_refused_with_the_jvms_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    actuation, _, channel = _actuation()
    with caplog.at_level(logging.WARNING, logger="tailguard"):
        actuation.available(["AV", "LaunchSpeculativeAttempts", "this Spark build lacks X.y"])
    # The warning names whose decisions go unapplied (the table of the services says who).
    assert "(speculator's decisions are rejected): this Spark build lacks X.y" in caplog.text
    actuation.available(["AV", "", ""])
    [rejected] = actuation.received(_copy(), Unchecked(), T0 + 200)
    assert isinstance(rejected, r.CommandRejected) and rejected.reason.endswith("lacks X.y")
    assert channel.getvalue() == b""


def test_a_block_reaches_every_job_and_is_lifted_when_its_time_is_up() -> None:
    actuation, translator, _ = _actuation()
    block = r.BlockNodes(
        job_id=JOB, ts=T0, id="blocklist-a", hosts=("h1",), until_ts=T0 + 60_000, cause="slow"
    )
    actuation.received(block, Unchecked(), T0 + 1)
    applied, blocked = actuation.outcome(["CO", "blocklist-a", "OK"], T0 + 2)
    assert isinstance(applied, r.CommandApplied)
    assert isinstance(blocked, r.NodeBlocked) and blocked.host == "h1"
    assert blocked.command_id == "blocklist-a"
    # A job that starts later starts under the block.
    started = translator.handle(["J", str(T0 + 5), "1", "1"])
    started += translator.handle(["G", "1", "5", "1", "", "next"])
    [inherited] = actuation.job_started(f"{APP}-job-1", T0 + 5)
    assert isinstance(inherited, r.NodeBlocked) and inherited.job_id == f"{APP}-job-1"
    assert actuation.tick(T0 + 59_999) == []
    lifted = actuation.tick(T0 + 60_000)
    assert {(e.job_id, e.host) for e in lifted if isinstance(e, r.NodeUnblocked)} == {
        (JOB, "h1"),
        (f"{APP}-job-1", "h1"),
    }


def test_the_fleet_list_blocks_the_applications_hosts_within_the_cap() -> None:
    actuation, _, channel = _actuation()
    listed = [
        FleetBlock(job_id="x", ts=T0, id="blocklist-f1", host="h2", until_ts=T0 + 600_000),
        FleetBlock(job_id="x", ts=T0, id="blocklist-f2", host="h3", until_ts=T0 + 300_000),
        FleetBlock(job_id="x", ts=T0, id="blocklist-f3", host="elsewhere", until_ts=T0 + 9e6),
    ]
    actuation.fleet(listed, T0 + 10)
    # One of three hosts at most (max-blocked-fraction 0.5): the longest block first.
    [line] = channel.getvalue().decode().splitlines()
    assert line.startswith("BLOCK\tfleet:blocklist-f1:h2\t")
    [blocked] = actuation.outcome(["CO", "fleet:blocklist-f1:h2", "OK"], T0 + 20)
    assert isinstance(blocked, r.NodeBlocked) and blocked.host == "h2"
    assert blocked.cause.startswith("fleet: ") and blocked.command_id == "blocklist-f1"
    actuation.fleet(listed, T0 + 30)  # read again: nothing new to do
    assert len(channel.getvalue().decode().splitlines()) == 1


def test_an_application_that_opted_out_takes_nothing_from_the_fleet_list() -> None:
    actuation, _, channel = _actuation(**{"blocklist.fleet": "false"})
    entry = FleetBlock(job_id="x", ts=T0, id="blocklist-f1", host="h2", until_ts=T0 + 60_000)
    actuation.fleet([entry], T0 + 10)
    assert channel.getvalue() == b""


def test_the_probe_gives_the_jvm_the_decision_timeout_in_milliseconds() -> None:
    actuation, _, channel = _actuation()
    actuation.probe()
    assert channel.getvalue() == b"PROBE\t2000\n"
    actuation, _, channel = _actuation(**{"tailguard.attach.decision-timeout": "750 ms"})
    actuation.probe()
    assert channel.getvalue() == b"PROBE\t750\n"


@pytest.mark.parametrize(
    ("value", "acts"),
    [
        (None, True),
        ("true", True),
        (" On ", True),
        ("1", True),
        ("false", False),
        ("OFF", False),
        ("no", False),
        ("0", False),
        ("maybe", False),
    ],
)
def test_the_relay_acts_only_when_attach_is_enabled_in_a_readable_way(
    value: str | None, acts: bool, caplog: pytest.LogCaptureFixture
) -> None:
    from tailguard.observer.relay import ATTACH_KEY, _attach_wanted

    settings = Settings({} if value is None else {ATTACH_KEY: value})
    with caplog.at_level(logging.INFO, logger="tailguard.observer"):
        assert _attach_wanted(settings, "kafka") is acts
    if value == "maybe":  # unreadable: observe, and say why
        assert "is not a boolean: observing only" in caplog.text
    assert _attach_wanted(settings, "file") is False  # no services to decide
