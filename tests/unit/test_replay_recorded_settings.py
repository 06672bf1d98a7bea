"""Replay decides with the settings the services recorded: no settings file, 0 differences, even
when the services' settings changed between two jobs; a what-if still overrides; a log without
announcements replays with the settings given, as before.

The "live" services here are the real processors (the shell's code, codec included), fed the
recorded demo job's events as two jobs, restarted with other settings in between (folding back
what they read, as a restart does).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from tests.unit.test_replay import write_archive

from tailguard.cli import main
from tailguard.codec import codec_for
from tailguard.inspect.explain import explain, render_text
from tailguard.inspect.history import history_of
from tailguard.inspect.settings_used import settings_used
from tailguard.model import records as r
from tailguard.model.config import Settings
from tailguard.replay.engine import Recorded, ReplayReport, replay
from tailguard.replay.inputs import read_archive
from tailguard.shell.processor import Processor
from tailguard.system.services import SERVICES

DEMO = Path(__file__).parent / "recorded" / "demo-speculation.avro"
CODEC = codec_for(Settings())
HOUR_MS = 3_600_000
SPEC_MAX = "execution.batch.speculative.max-concurrent-executions"
# The second run's services: each core's decisions depend on one of these here.
CHANGED = {
    SPEC_MAX: "3",
    "slow-task-detector.execution-time.baseline-multiplier": "1.2",
    "execution.batch.adaptive.auto-parallelism.avg-data-volume-per-task": "256 KiB",
    "blocklist.min-slow-attempts": "2",
}


def demo_events(job: str, later_ms: int = 0) -> list[r.Event]:
    """The demo job's events as job `job`, `later_ms` later (its times are all moved)."""
    return [
        _moved(dataclasses.replace(x.record, job_id=job, id=f"{job}-{x.record.id}"), later_ms)
        for x in read_archive(DEMO, Settings())
        if x.topic == r.EVENTS_TOPIC and isinstance(x.record, r.Event)
    ]


def _moved(event: r.Event, later_ms: int) -> r.Event:
    times = {
        f.name: getattr(event, f.name) + later_ms
        for f in dataclasses.fields(event)
        if f.name == "ts" or (f.name.endswith("_ts") and isinstance(getattr(event, f.name), int))
    }
    return dataclasses.replace(event, **times)


class LiveServices:
    """The five processors; `restart` starts them again under other settings."""

    def __init__(self, settings: Settings, announcing: bool = True) -> None:
        # Off: as the services were before they announced (nothing of it reaches the log).
        self.announcing = announcing
        self.read: dict[str, list[bytes]] = {s.name: [] for s in SERVICES}
        self.processors = {s.name: Processor(s, settings, CODEC) for s in SERVICES}

    def restart(self, settings: Settings) -> None:
        for spec in SERVICES:
            fresh = Processor(spec, settings, CODEC)
            for offset, raw in enumerate(self.read[spec.name]):
                fresh.replay(raw, 0, offset)
            self.processors[spec.name] = fresh

    def feed(self, topic: str, record: r.Record) -> list[Recorded]:
        """What the services emit on `record`, and on what that emits, as an agent archives
        it (the fleet list's own topic is no part of a job's log)."""
        raw = CODEC.encode(record)
        logged: list[Recorded] = []
        for spec in SERVICES:
            if spec.input_topic != topic:
                continue
            offset = len(self.read[spec.name])
            self.read[spec.name].append(raw)
            for out in self.processors[spec.name].process(raw, 0, offset):
                if out.topic in r.TOPICS and out.value is not None:
                    emitted = CODEC.decode(out.value)
                    if not self.announcing and isinstance(emitted, r.PolicySettings):
                        continue
                    logged.append(Recorded(out.topic, emitted))
                    logged.extend(self.feed(out.topic, emitted))
        return logged


def two_jobs(
    first: Settings, second: Settings, announcing: bool = True
) -> dict[str, list[Recorded]]:
    """Job a under the services' `first` settings, job b after a restart under `second`."""
    services = LiveServices(first, announcing)
    logs: dict[str, list[Recorded]] = {}
    # The second job an hour later: the fleet list has forgotten the first one's evidence, so
    # each job's log alone holds all its decisions depend on.
    for job, settings, later_ms in (("job-a", first, 0), ("job-b", second, HOUR_MS)):
        if settings is not first:
            services.restart(settings)
        log: list[Recorded] = []
        for event in demo_events(job, later_ms):
            log += [Recorded(r.EVENTS_TOPIC, event), *services.feed(r.EVENTS_TOPIC, event)]
        logs[job] = log
    return logs


def lines(report: ReplayReport) -> list[str]:
    return [s.line() for s in report.services] + report.notes(5)


def test_each_jobs_log_replays_exactly_with_no_settings_though_the_settings_changed() -> None:
    logs = two_jobs(Settings(), Settings(CHANGED))
    for job, log in logs.items():
        announced = [x.record for x in log if isinstance(x.record, r.PolicySettings)]
        assert sorted(a.service for a in announced) == sorted(s.name for s in SERVICES), job
        report = replay(log, Settings())
        assert report.differences == 0, (job, lines(report))
        assert all(plan.recorded for plan in report.settings)
        assert sum(s.reproduced for s in report.services) > len(SERVICES)
    # The change was real: job b's log replayed under job a's settings differs.
    a_versions = {x.record.service: x.record.version for x in logs["job-a"] if _announces(x)}
    b_versions = {x.record.service: x.record.version for x in logs["job-b"] if _announces(x)}
    assert all(a_versions[s] != b_versions[s] for s in a_versions)
    without = [x for x in logs["job-b"] if not _announces(x)]
    assert replay(without, Settings()).differences > 0


def _announces(item: Recorded) -> bool:
    return isinstance(item.record, r.PolicySettings)


def test_the_topics_of_both_jobs_replay_exactly_across_the_restart() -> None:
    logs = two_jobs(Settings(), Settings(CHANGED))
    report = replay(logs["job-a"] + logs["job-b"], Settings())
    assert report.differences == 0, lines(report)
    assert all(len(plan.versions) == 2 for plan in report.settings), [
        plan.describe() for plan in report.settings
    ]


def test_a_settings_file_given_to_an_audit_does_not_replace_the_recorded_settings() -> None:
    log = two_jobs(Settings(CHANGED), Settings(CHANGED))["job-b"]
    assert replay(log, Settings()).differences == 0
    assert replay(log, Settings({SPEC_MAX: "2"})).differences == 0


def test_a_what_if_still_overrides_the_recorded_settings() -> None:
    log = two_jobs(Settings(CHANGED), Settings(CHANGED))["job-b"]
    same = replay(log, Settings(), what_if=True, overrides={})
    assert same.differences == 0, lines(same)
    report = replay(log, Settings(), what_if=True, overrides={SPEC_MAX: "2"})
    by_name = {s.service: s for s in report.services}
    assert by_name["speculator"].differences and not by_name["decider"].differences
    # Decisions only: the announcements name the what-if settings and are left out.
    assert not any(
        isinstance(d.recorded or d.replayed, r.PolicySettings)
        for s in report.services
        for d in s.differences
    )


def test_a_log_from_before_the_announcements_replays_with_the_settings_given() -> None:
    before = two_jobs(Settings(CHANGED), Settings(CHANGED), announcing=False)["job-b"]
    assert not any(_announces(x) for x in before)
    report = replay(before, Settings(CHANGED))
    assert report.differences == 0, lines(report)
    assert not any(plan.recorded for plan in report.settings)
    assert sum(s.reproduced for s in report.services) > len(SERVICES)


def test_tailguard_replay_of_an_archive_needs_no_settings_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    archive = tmp_path / "job-b.avro"
    write_archive(archive, two_jobs(Settings(), Settings(CHANGED))["job-b"])
    assert main(["replay", str(archive)]) == 0
    said = capsys.readouterr().out
    assert "settings: as the services recorded them in the log" in said
    assert said.count(" reproduced, 0 differences") == len(SERVICES), said
    what_if = tmp_path / "what-if.toml"
    what_if.write_text(f'"{SPEC_MAX}" = "2"\n')
    assert main(["replay", str(archive), "--what-if", str(what_if)]) == 1
    # The change is told against what the service recorded, not against the defaults.
    assert f"what-if {SPEC_MAX}: 3 -> 2" in capsys.readouterr().out


def test_explain_shows_the_settings_the_service_recorded_for_the_job() -> None:
    log = two_jobs(Settings(), Settings(CHANGED))["job-b"]
    history = history_of([x.record for x in log])
    (announced,) = [
        x.record
        for x in log
        if isinstance(x.record, r.PolicySettings) and x.record.service == "speculator"
    ]
    used = settings_used("speculator", history)
    assert used.version == announced.version
    assert {u.key: (u.value, u.source) for u in used.settings}[SPEC_MAX] == ("3", "service")
    launch = next(x.record for x in log if isinstance(x.record, r.LaunchSpeculativeAttempts))
    text = render_text(explain(history, launch))
    assert f"(settings version {announced.version}), which a replay decides with" in text
    assert "which the archive does not hold" not in text
