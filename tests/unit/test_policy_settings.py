"""The services' policy settings as facts in the log: versions, announcements, a job's own
settings in the speculator and the blocklist."""

from __future__ import annotations

import dataclasses
import json

from speculation_histories import slow_finding

from tailguard.blocklist.fleet import FleetBlocklist
from tailguard.blocklist.policy import BlocklistTracker
from tailguard.model import records as r
from tailguard.model.authority import (
    UNAUTHENTICATED_COMMANDS_TOPIC,
    UNAUTHENTICATED_FINDINGS_TOPIC,
    Signed,
    Unauthentic,
    Unchecked,
    received_archive_topic,
)
from tailguard.model.config import BEFORE_THEIR_TIME, DEFAULTS, Settings, is_secret
from tailguard.model.policy_settings import (
    SettingsAnnouncer,
    job_policy,
    policy_values,
    recorded_settings,
    settings_version,
)
from tailguard.speculator.policy import SpeculationStrategy

SPEC_MAX = "execution.batch.speculative.max-concurrent-executions"
MIN_SLOW = "blocklist.min-slow-attempts"
EVIDENCE_SLOWDOWN = "blocklist.evidence-slowdown"


def submitted(job: str, config: dict[str, str], ts: int = 0) -> r.JobSubmitted:
    return r.JobSubmitted(
        job_id=job,
        ts=ts,
        id=f"{job}-e0",
        name=job,
        graph=r.JobGraphSpec(vertices=(), edges=()),
        config=config,
    )


def detector_announcement(job: str, job_settings: dict[str, str]) -> r.Record:
    (announced,) = SettingsAnnouncer.of("detector", Settings()).before(submitted(job, job_settings))
    return announced


def test_the_version_names_the_values_and_which_were_set() -> None:
    values = policy_values(Settings())
    base = settings_version(values, ())
    assert base == settings_version(dict(reversed(values.items())), ())  # order is no part
    assert settings_version({**values, SPEC_MAX: "3"}, ()) != base
    # The same value, set explicitly, decides otherwise for a job that asks for another.
    assert settings_version(values, (SPEC_MAX,)) != base


def test_an_announcement_holds_every_policy_key_and_nothing_else() -> None:
    settings = Settings({SPEC_MAX: "3", "kafka.sasl.password": "hunter2", "s3.secret-key": "k"})
    (announced,) = SettingsAnnouncer.of("speculator", settings).before(submitted("j", {}))
    assert isinstance(announced, r.CommandSettings)
    assert set(announced.settings) == set(DEFAULTS)
    assert not any(is_secret(k) for k in announced.settings)
    assert "hunter2" not in repr(announced) and announced.explicit == (SPEC_MAX,)
    assert announced.settings[SPEC_MAX] == "3"


def test_a_job_is_announced_at_its_start_and_a_restart_with_other_settings_shows() -> None:
    settings = Settings({MIN_SLOW: "3"})
    announcer = SettingsAnnouncer.of("detector", settings)
    job = submitted("a", {SPEC_MAX: "4", "tailguard.services": "on"}, ts=5)
    (first,) = announcer.before(job)
    assert isinstance(first, r.FindingSettings)  # the detector's go with its findings
    assert (first.ts, first.caused_by, first.version) == (5, (job.id,), announcer.version)
    assert first.job_settings == {SPEC_MAX: "4"}  # the markers are not policy
    assert announcer.before(r.Tick(job_id="a", ts=6, id="a-e1")) == []
    # The same settings after a restart: the same announcement; other settings: another.
    assert SettingsAnnouncer.of("detector", settings).before(job) == [first]
    (other,) = SettingsAnnouncer.of("detector", Settings({MIN_SLOW: "4"})).before(job)
    assert other.id != first.id and other.version != first.version
    # A service that reads findings announces at the detector's, passing the job's settings on.
    (spec,) = SettingsAnnouncer.of("speculator", Settings()).before(first)
    assert isinstance(spec, r.CommandSettings) and spec.job_settings == first.job_settings
    assert spec.caused_by == (first.id,)
    assert SettingsAnnouncer.of("detector", settings).before(first) == []


def test_the_recorded_settings_rebuild_the_same_version_and_the_same_per_job_rule() -> None:
    settings = Settings({MIN_SLOW: "3", SPEC_MAX: "2"})
    (announced,) = SettingsAnnouncer.of("blocklist", settings).before(submitted("j", {}))
    assert isinstance(announced, r.PolicySettings)
    rebuilt = recorded_settings(announced)
    assert SettingsAnnouncer.of("blocklist", rebuilt).version == announced.version
    job = {MIN_SLOW: "5", "blocklist.evidence-window": "1 min"}
    # The service's explicit keys win over the job's; the others follow the job.
    assert rebuilt.for_job(job)[MIN_SLOW] == settings.for_job(job)[MIN_SLOW] == "3"
    assert rebuilt.for_job(job)["blocklist.evidence-window"] == "1 min"
    # A value another release defaults differently is still the recorded one.
    older = dataclasses.replace(
        announced, settings={**announced.settings, "blocklist.evidence-window": "5 min"}
    )
    assert recorded_settings(older)["blocklist.evidence-window"] == "5 min"
    assert recorded_settings(announced, {MIN_SLOW: "1"}).for_job(job)[MIN_SLOW] == "1"


def test_a_key_newer_than_the_announcement_decides_as_the_release_before_it() -> None:
    (announced,) = SettingsAnnouncer.of("blocklist", Settings()).before(submitted("j", {}))
    assert isinstance(announced, r.PolicySettings)
    assert recorded_settings(announced)[EVIDENCE_SLOWDOWN] == DEFAULTS[EVIDENCE_SLOWDOWN]
    # Announced by a release before the key: every slow attempt counted then.
    older = dataclasses.replace(
        announced, settings={k: v for k, v in announced.settings.items() if k != EVIDENCE_SLOWDOWN}
    )
    assert recorded_settings(older)[EVIDENCE_SLOWDOWN] == BEFORE_THEIR_TIME[EVIDENCE_SLOWDOWN]
    assert BEFORE_THEIR_TIME[EVIDENCE_SLOWDOWN] != DEFAULTS[EVIDENCE_SLOWDOWN]
    # A what-if still wins.
    assert recorded_settings(older, {EVIDENCE_SLOWDOWN: "3"})[EVIDENCE_SLOWDOWN] == "3"


def test_job_policy_keeps_the_policy_keys() -> None:
    assert job_policy({SPEC_MAX: "3", "tailguard.services": "off", "x.y": "z"}) == {SPEC_MAX: "3"}


def _speculative_counts(strategy: SpeculationStrategy, job: str) -> list[int]:
    from test_speculator_policy import subtask

    out = strategy.handle(slow_finding(subtask(0, "h1"), job_id=job))
    return [c.count for c in out if isinstance(c, r.LaunchSpeculativeAttempts)]


def test_the_speculator_honours_a_jobs_own_settings_for_that_job_alone() -> None:
    strategy = SpeculationStrategy(Settings())
    strategy.handle(detector_announcement("wide", {SPEC_MAX: "4"}))
    strategy.handle(detector_announcement("plain", {}))
    assert _speculative_counts(strategy, "wide") == [3]
    assert _speculative_counts(strategy, "plain") == [1]
    assert _speculative_counts(strategy, "unannounced") == [1]
    off = SpeculationStrategy(Settings())
    off.handle(detector_announcement("off", {"execution.batch.speculative.enabled": "false"}))
    assert _speculative_counts(off, "off") == []
    # A key the service sets itself wins over the job's.
    pinned = SpeculationStrategy(Settings({SPEC_MAX: "2"}))
    pinned.handle(detector_announcement("wide", {SPEC_MAX: "4"}))
    assert _speculative_counts(pinned, "wide") == [1]


def _blocks_after_one_slow_subtask(core: BlocklistTracker | FleetBlocklist, job: str) -> int:
    from test_blocklist_policy import HOSTS, slow_on

    finding = slow_finding(slow_on(0, ("h1", True)), job_id=job, ts=1000, hosts=HOSTS)
    return sum(1 for c in core.handle(finding) if isinstance(c, r.BlockNodes))


def test_the_blocklist_honours_a_jobs_own_rule_for_that_job_alone_and_keeps_it() -> None:
    tracker = BlocklistTracker(Settings())  # two slow subtasks on a host before a block
    tracker.handle(detector_announcement("eager", {MIN_SLOW: "1"}))
    assert _blocks_after_one_slow_subtask(tracker, "eager") == 1
    assert _blocks_after_one_slow_subtask(tracker, "other") == 0
    # The rule is part of the state a restarted service loads.
    fleet = FleetBlocklist(Settings())
    fleet.handle(detector_announcement("eager", {MIN_SLOW: "1"}))
    restored = FleetBlocklist(Settings())
    restored.import_state(fleet.export_state())
    assert _blocks_after_one_slow_subtask(restored, "eager") == 1
    # States written before rules per job load as having none.
    state = json.loads(fleet.export_state())
    del state["per_job"]["rules"]
    older = FleetBlocklist(Settings())
    older.import_state(json.dumps(state).encode())
    assert _blocks_after_one_slow_subtask(older, "eager") == 0


def test_an_agent_archives_an_announcement_that_does_not_check_out_apart() -> None:
    finding = detector_announcement("j", {})
    (command,) = SettingsAnnouncer.of("speculator", Settings()).before(finding)
    forged = Unauthentic("no signature")
    assert received_archive_topic(finding, r.FINDINGS_TOPIC, forged) == (
        UNAUTHENTICATED_FINDINGS_TOPIC
    )
    # Only the detector writes findings; a service's own settings travel with its commands.
    assert received_archive_topic(finding, r.FINDINGS_TOPIC, Signed("speculator", "k1"))
    assert received_archive_topic(finding, r.FINDINGS_TOPIC, Signed("detector", "k1")) is None
    assert received_archive_topic(command, r.COMMANDS_TOPIC, forged) == (
        UNAUTHENTICATED_COMMANDS_TOPIC
    )
    assert received_archive_topic(command, r.COMMANDS_TOPIC, Signed("speculator", "k1")) is None
    assert received_archive_topic(command, r.COMMANDS_TOPIC, Unchecked()) is None
