"""Replay and commands that were never service decisions: a forged command the agent rejected
neither breaks the audit nor passes it silently; a command no service emits is a difference."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from tailguard.archive import ArchiveWriter
from tailguard.decider.policy import ParallelismDecider
from tailguard.model import records as r
from tailguard.model.authority import NOT_PERMITTED, UNAUTHENTICATED_COMMANDS_TOPIC
from tailguard.model.config import Settings
from tailguard.replay import cli
from tailguard.replay.engine import Recorded, ReplayReport, replay

SETTINGS = Settings()
JOB = "job"
UNSIGNED = "unauthenticated: unsigned (no tailguard.signature header)"
_seq = iter(range(1, 10_000))


def event(cls: type[r.Event], **fields: Any) -> r.Event:
    n = next(_seq)
    return cls(job_id=JOB, ts=1_000 + n, id=f"{JOB}-e{n}", **fields)


def answer(command: r.Command, reason: str | None = None) -> r.Event:
    """The agent's answer to a command: applied, or rejected with `reason`."""
    kind = type(command).__name__
    if reason is None:
        return event(r.CommandApplied, command_id=command.id, command_type=kind)
    return event(r.CommandRejected, command_id=command.id, command_type=kind, reason=reason)


def submitted() -> r.JobSubmitted:
    source = r.VertexSpec(
        name="src", kind=r.VertexKind.SOURCE, max_parallelism=8, split_bytes=(20 << 20,) * 3
    )
    sink = r.VertexSpec(name="sink", kind=r.VertexKind.SINK, parallelism=1)
    edge = r.EdgeSpec("src", "sink", r.Distribution.ALL_TO_ALL)
    job = event(r.JobSubmitted, name=JOB, graph=r.JobGraphSpec((source, sink), (edge,)), config={})
    assert isinstance(job, r.JobSubmitted)
    return job


def genuine_log() -> tuple[list[Recorded], r.SetParallelism]:
    """A job's start as archived: JobSubmitted, the decider's SetParallelism, its answer."""
    job = submitted()
    (decision,) = ParallelismDecider(SETTINGS).handle(job)
    assert isinstance(decision, r.SetParallelism)
    log = [
        Recorded(r.EVENTS_TOPIC, job),
        Recorded(r.COMMANDS_TOPIC, decision),
        Recorded(r.EVENTS_TOPIC, answer(decision)),
    ]
    return log, decision


def forged_fail(cid: str = "failover-0badc0de") -> r.FailJob:
    return r.FailJob(job_id=JOB, ts=2_000, id=cid, reason="forged")


def decider_line(report: ReplayReport) -> str:
    return next(s.line() for s in report.services if s.service == "decider")


def test_a_genuine_log_has_no_differences_and_nothing_rejected() -> None:
    log, _ = genuine_log()
    report = replay(log, SETTINGS)
    assert report.differences == 0 and report.rejected == [] and report.unattributed == []
    assert decider_line(report) == "decider: 1 commands reproduced, 0 differences"


def test_an_archived_unauthenticated_command_is_reported_not_compared() -> None:
    log, _ = genuine_log()
    forged = forged_fail()
    log += [
        Recorded(UNAUTHENTICATED_COMMANDS_TOPIC, forged),
        Recorded(r.EVENTS_TOPIC, answer(forged, UNSIGNED)),
    ]
    report = replay(log, SETTINGS)
    assert report.differences == 0
    assert [(x.command, x.reason) for x in report.rejected] == [(forged, UNSIGNED)]
    assert report.notes(5) == [
        "1 command(s) the agent rejected as not from a permitted service "
        "(not decisions, left out of the comparison):",
        f"    FailJob(failover-0badc0de): {UNSIGNED}",
    ]


def test_a_forgery_that_reuses_a_decisions_id_is_told_apart_in_the_archive() -> None:
    """Decision ids are predictable: a forger can send the decider's id first. The archive keeps
    the forgery under its own topic, so the decider's real decision is still the one compared."""
    log, decision = genuine_log()
    forged = dataclasses.replace(decision, parallelism=decision.parallelism + 1)
    log[1:1] = [
        Recorded(UNAUTHENTICATED_COMMANDS_TOPIC, forged),
        Recorded(r.EVENTS_TOPIC, answer(forged, UNSIGNED)),
    ]
    report = replay(log, SETTINGS)
    assert report.differences == 0, [s.line() for s in report.services]
    assert decider_line(report) == "decider: 1 commands reproduced, 0 differences"
    assert [x.command for x in report.rejected] == [forged]


def test_read_from_the_topics_a_command_only_ever_rejected_for_authority_is_left_out() -> None:
    log, _ = genuine_log()
    forged, not_permitted = forged_fail(), forged_fail("failover-5151")
    reason = NOT_PERMITTED + "signed by blocklist but its id names 'failover'"
    log += [
        Recorded(r.COMMANDS_TOPIC, forged),  # on the topic, nothing marks it
        Recorded(r.COMMANDS_TOPIC, forged),  # sent twice: reported once
        Recorded(r.COMMANDS_TOPIC, not_permitted),
        Recorded(r.EVENTS_TOPIC, answer(forged, UNSIGNED)),
        Recorded(r.EVENTS_TOPIC, answer(forged, UNSIGNED)),
        Recorded(r.EVENTS_TOPIC, answer(not_permitted, reason)),
    ]
    report = replay(log, SETTINGS)
    assert report.differences == 0
    assert [(x.command.id, x.reason) for x in report.rejected] == [
        (forged.id, UNSIGNED),
        (not_permitted.id, reason),
    ]


def test_a_forged_command_the_agent_took_is_a_difference() -> None:
    """Signing off: the agent took the forgery. No core emits it, so the audit fails on it,
    whether its id names a service or not."""
    log, _ = genuine_log()
    named, unnamed = forged_fail(), forged_fail("evil-1")
    log += [
        Recorded(r.COMMANDS_TOPIC, named),
        Recorded(r.EVENTS_TOPIC, answer(named)),
        Recorded(r.COMMANDS_TOPIC, unnamed),
        Recorded(r.EVENTS_TOPIC, answer(unnamed)),
    ]
    report = replay(log, SETTINGS)
    assert report.differences == 2
    failover = next(s for s in report.services if s.service == "failover")
    assert [d.recorded for d in failover.differences] == [named]
    assert report.unattributed == [unnamed]
    assert report.notes(5)[:2] == [
        "1 record(s) whose id names no service (differences):",
        "    FailJob(evil-1)",
    ]


def test_read_from_the_topics_a_forgery_reusing_a_taken_id_is_not_passed_silently() -> None:
    """The limit of the topics (no signatures in a replay): when the forgery came first and the
    decider's command with the same id was then applied, the copies cannot be told apart, and the
    audit shows a difference rather than passing."""
    log, decision = genuine_log()
    forged = dataclasses.replace(decision, parallelism=decision.parallelism + 1)
    log[1:1] = [
        Recorded(r.COMMANDS_TOPIC, forged),
        Recorded(r.EVENTS_TOPIC, answer(forged, UNSIGNED)),
    ]
    report = replay(log, SETTINGS)
    assert report.differences == 1
    assert report.rejected == []


def test_the_cli_prints_the_rejected_commands_and_passes_the_audit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log, _ = genuine_log()
    forged = forged_fail()
    log += [
        Recorded(UNAUTHENTICATED_COMMANDS_TOPIC, forged),
        Recorded(r.EVENTS_TOPIC, answer(forged, UNSIGNED)),
    ]
    archive = tmp_path / "job.avro"
    with ArchiveWriter(archive) as writer:
        for item in log:
            direction = "published" if item.topic == r.EVENTS_TOPIC else "received"
            writer.append(item.topic, direction, item.record, item.record.ts)
    parser = cli.argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args([str(archive)])
    args.config = None
    assert cli.run(args) == 0
    out = capsys.readouterr().out
    assert "decider: 1 commands reproduced, 0 differences" in out
    assert f"FailJob(failover-0badc0de): {UNSIGNED}" in out
