"""Replay: a recorded log reproduces every decision; a changed one is caught; what-if differs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from tests.unit.speculation_histories import SIMULATION_CONFIG, SimulationParams, simulate

from tailguard.archive import ArchiveWriter
from tailguard.decider.policy import ParallelismDecider
from tailguard.failover.policy import FailoverStrategy
from tailguard.model import records as r
from tailguard.model.config import FLIP_168, Settings
from tailguard.replay import cli
from tailguard.replay.engine import Recorded, replay

SETTINGS = Settings(SIMULATION_CONFIG)


def recorded_log(settings: Settings = SETTINGS) -> list[Recorded]:
    """A job's log as the agent archives it: events, then the findings and commands in the
    order they were emitted (the simulator applies them like the agent)."""
    run = simulate(SimulationParams(seed=3), settings)
    assert run.findings and run.commands, "the scenario must produce decisions"
    # The simulator drives the detector, speculator and blocklist; the decider and failover
    # services read the same events live.
    decider, failover = ParallelismDecider(settings), FailoverStrategy(settings)
    others = [out for e in run.events for core in (decider, failover) for out in core.handle(e)]
    return (
        [Recorded(r.EVENTS_TOPIC, e) for e in run.events]
        + [Recorded(r.FINDINGS_TOPIC, f) for f in run.findings]
        + [Recorded(r.COMMANDS_TOPIC, c) for c in [*run.commands, *others]]
    )


def test_recorded_decisions_are_reproduced() -> None:
    log = recorded_log()
    report = replay(log, SETTINGS)
    assert report.differences == 0, [s.line() for s in report.services]
    by_name = {s.service: s for s in report.services}
    assert by_name["detector"].reproduced > 0
    assert by_name["speculator"].reproduced > 0
    assert by_name["detector"].line().startswith("detector: ")
    # The default profile's slow-host rule spoke, and its verdicts were reproduced too.
    verdicts = [x for x in log if getattr(x.record, "slow_hosts", ())]
    assert verdicts and any(isinstance(x.record, r.BlockNodes) for x in log)


@pytest.mark.parametrize(
    "rules",
    [
        # The progress-rate rule on top of Flink's, with AttemptProgress events in the log.
        {"slow-task-detector.progress-rate.enabled": "true"},
        # FLIP-168's every-slow-attempt blocklist.
        {"blocklist.min-slow-attempts": "1", "blocklist.evidence-window": "0 ms"},
        # FLIP-168's rules exactly (the slow-host rule off too).
        FLIP_168,
        # The decider's other algorithm and options.
        {
            "decider.algorithm": "optimal",
            "execution.batch.adaptive.auto-parallelism.normalize-to-power-of-two": "true",
            "execution.batch.adaptive.auto-parallelism.max-broadcast-ratio": "0.5",
        },
    ],
)
def test_every_rule_and_option_is_reproduced(rules: dict[str, str]) -> None:
    settings = SETTINGS.merged(rules)
    log = recorded_log(settings)
    report = replay(log, settings)
    assert report.differences == 0, [s.line() for s in report.services]
    by_name = {s.service: s for s in report.services}
    assert by_name["detector"].reproduced > 0
    assert by_name["decider"].reproduced > 0


def test_duplicates_from_a_restarted_service_are_not_differences() -> None:
    log = recorded_log()
    commands = [x for x in log if x.topic == r.COMMANDS_TOPIC]
    report = replay(log + commands[:3], SETTINGS)
    assert report.differences == 0


def test_a_changed_decision_is_a_difference() -> None:
    log = recorded_log()
    index = next(i for i, x in enumerate(log) if isinstance(x.record, r.LaunchSpeculativeAttempts))
    launch = log[index].record
    assert isinstance(launch, r.LaunchSpeculativeAttempts)
    log[index] = Recorded(r.COMMANDS_TOPIC, dataclasses.replace(launch, count=launch.count + 1))
    report = replay(log, SETTINGS)
    speculator = next(s for s in report.services if s.service == "speculator")
    assert len(speculator.differences) == 1
    assert "count" in speculator.differences[0].describe()
    assert report.differences == 1


def test_what_if_reports_how_decisions_would_differ() -> None:
    log = recorded_log()
    stricter = SETTINGS.merged(
        {
            "slow-task-detector.execution-time.baseline-multiplier": "100",
            "slow-task-detector.slow-host.slowdown": "100",
        }
    )
    report = replay(log, stricter, what_if=True)
    detector = next(s for s in report.services if s.service == "detector")
    assert detector.replayed < detector.recorded  # far fewer attempts count as slow
    assert detector.differences


def write_archive(path: Path, log: list[Recorded]) -> None:
    with ArchiveWriter(path) as archive:
        for item in log:
            direction = "published" if item.topic == r.EVENTS_TOPIC else "received"
            archive.append(item.topic, direction, item.record, item.record.ts)


def test_cli_audits_an_archive(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    archive = tmp_path / "job.avro"
    write_archive(archive, recorded_log())
    config = tmp_path / "deployment.toml"
    config.write_text("".join(f'"{k}" = "{v}"\n' for k, v in SIMULATION_CONFIG.items()))
    parser = cli.argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args([str(archive)])
    args.config = str(config)
    assert cli.run(args) == 0
    out = capsys.readouterr().out
    assert "detector:" in out and "0 differences" in out

    what_if = tmp_path / "what-if.toml"
    what_if.write_text('"slow-task-detector.execution-time.baseline-multiplier" = "100"\n')
    args = parser.parse_args([str(archive), "--what-if", str(what_if)])
    args.config = str(config)
    # Far fewer attempts count as slow under the what-if: decisions differ, which exits 1.
    assert cli.run(args) == 1
    assert "would differ" in capsys.readouterr().out


def test_cli_rejects_a_file_that_is_not_an_archive(tmp_path: Path) -> None:
    bogus = tmp_path / "not-an-archive.avro"
    bogus.write_bytes(b"hello")
    parser = cli.argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args([str(bogus)])
    args.config = None
    assert cli.run(args) == 2
