"""The policy settings behind a service's decisions, as facts in the log.

A service reads its settings once, when it starts. So that a log alone says which settings made
each decision (pyeventsourcing's rule: what a decision depends on is an event too), a service
announces them, per job, before it decides anything for the job: a `PolicySettings` record on
the topic its outputs travel on, so the job's agent archives it with the decisions. Its
`version` is a digest of the settings; a service that restarts with other settings announces
the new version to each job on the job's next record, so the announcement a decision comes after
is the one it was made under. A replay decides with the recorded settings (`recorded_settings`),
which no settings file can contradict, and reproduces the announcements themselves, so a replay
under other settings shows as a difference.

An announcement also carries the job's own policy settings (its `JobSubmitted.config`), as the
service learnt them: the detector's (`FindingSettings`, the first finding of every job) is how
the speculator and the blocklist, which read findings, not events, honour a job's settings.

Pure: the announcer is a function of the records it is given, like the cores.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Mapping

from tailguard.model import records as r
from tailguard.model.authority import INPUT_WRITERS
from tailguard.model.config import DEFAULTS, Settings, is_secret
from tailguard.model.ids import derived_id

__all__ = [
    "MAX_ANNOUNCED_JOBS",
    "SettingsAnnouncer",
    "announcement_type",
    "job_policy",
    "policy_values",
    "recorded_settings",
    "settings_version",
]

# Jobs whose announcement is remembered: one forgotten announces again on its next record, with
# the same id (the readers keep the first). Above any core's own bound on jobs it tracks.
MAX_ANNOUNCED_JOBS = 4096


def _policy(values: Mapping[str, str]) -> dict[str, str]:
    # The policy keys only, and never a secret (none of them is one; the check keeps it so).
    return {k: str(v) for k, v in sorted(values.items()) if k in DEFAULTS and not is_secret(k)}


def policy_values(settings: Settings) -> dict[str, str]:
    """Every policy key with its value in `settings`: what an announcement publishes."""
    return _policy(settings)


def job_policy(config: Mapping[str, str]) -> dict[str, str]:
    """The policy settings a job asked for (`JobSubmitted.config` holds markers too)."""
    return _policy(config)


def settings_version(values: Mapping[str, str], explicit: tuple[str, ...]) -> str:
    """The digest a decision's settings are named by: the same values and explicit keys give
    the same version on any machine and in any release."""
    canonical = json.dumps(
        {"settings": _policy(values), "explicit": sorted(explicit)},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def announcement_type(service: str) -> type[r.PolicySettings]:
    """Where a service announces: with its findings if it may write findings, else with its
    commands (a reader takes findings from the detector alone: `authority.INPUT_WRITERS`)."""
    if service in INPUT_WRITERS[r.FINDINGS_TOPIC]:
        return r.FindingSettings
    return r.CommandSettings


def recorded_settings(
    announced: r.PolicySettings, overrides: Mapping[str, str] | None = None
) -> Settings:
    """The settings the announcing service decided with: its explicit keys over its recorded
    values for the others, so `for_job` gives each job what the service gave it; `overrides`
    (a what-if) are explicit on top."""
    explicit = {k: announced.settings[k] for k in announced.explicit if k in announced.settings}
    return Settings({**explicit, **(overrides or {})}, base=announced.settings)


class SettingsAnnouncer:
    """Announces `service`'s settings to each job once, at the first record of the job it is
    given. A fresh announcer (a restarted service) announces again to every job it hears from;
    `remember` gives it the records a restart folds back into the core, so that it still knows
    each job's own settings then."""

    def __init__(
        self,
        service: str,
        values: Mapping[str, str],
        explicit: tuple[str, ...],
        max_jobs: int = MAX_ANNOUNCED_JOBS,
    ) -> None:
        self.service = service
        self._type = announcement_type(service)
        self._values = _policy(values)
        self.explicit = tuple(sorted(k for k in explicit if k in self._values))
        self.version = settings_version(self._values, self.explicit)
        self._max_jobs = max_jobs
        # job id -> (the job's own policy settings, whether it has had the announcement)
        self._jobs: OrderedDict[str, tuple[dict[str, str], bool]] = OrderedDict()

    @classmethod
    def of(cls, service: str, settings: Settings) -> SettingsAnnouncer:
        """The announcer of a service running with `settings`."""
        return cls(service, policy_values(settings), tuple(settings.explicit()))

    @classmethod
    def replaying(cls, announced: r.PolicySettings) -> SettingsAnnouncer:
        """An announcer that announces what `announced` did, to the letter: a later release
        with more policy keys still reproduces it (its cores take the new keys' defaults)."""
        return cls(announced.service, announced.settings, announced.explicit)

    def remember(self, record: r.Record) -> None:
        """Note what `record` says of its job's settings, announcing nothing."""
        self._note(record, announced=False)

    def before(self, record: r.Record) -> list[r.Record]:
        """The announcement to send before the outputs for `record`, if its job has none."""
        already = self._jobs.get(record.job_id, ({}, False))[1]
        job_settings = self._note(record, announced=True)
        if already:
            return []
        return [
            self._type(
                job_id=record.job_id,
                ts=record.ts,
                id=derived_id(self.service, record.job_id, "settings", self.version),
                caused_by=(record.id,),
                service=self.service,
                version=self.version,
                settings=dict(self._values),
                explicit=self.explicit,
                job_settings=dict(job_settings),
            )
        ]

    def _note(self, record: r.Record, announced: bool) -> dict[str, str]:
        job_id = record.job_id
        known, was_announced = self._jobs.pop(job_id, ({}, False))
        if isinstance(record, r.JobSubmitted):
            known = job_policy(record.config)
        elif isinstance(record, r.FindingSettings) and record.job_settings:
            known = dict(record.job_settings)
        self._jobs[job_id] = (known, was_announced or announced)
        while len(self._jobs) > self._max_jobs:
            self._jobs.popitem(last=False)
        return known
