"""The policy settings behind a service's decisions, as facts in the log.

A service reads its settings once, when it starts. So that a log alone says which settings made
each decision (pyeventsourcing's rule: what a decision depends on is an event too), a service
announces them to every job as the job starts, before it decides anything for it: a
`PolicySettings` record on the topic its outputs travel on, so the job's agent archives it with
the decisions. Its `version` is a digest of the settings; a service restarted with other
settings announces the new version to the jobs that start after, so the announcement in a job's
log is the one its decisions were made under. A replay decides with the recorded settings
(`recorded_settings`), which no settings file can contradict, and reproduces the announcements
themselves, so a replay under other settings shows as a difference.

An announcement also carries the job's own policy settings (its `JobSubmitted.config`), as the
service learnt them: the detector's (`FindingSettings`, the first finding of every job) is how
the speculator and the blocklist, which read findings, not events, honour a job's settings.

Pure: the announcer is a function of the records it is given, like the cores.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping

from tailguard.model import records as r
from tailguard.model.authority import INPUT_WRITERS
from tailguard.model.config import BEFORE_THEIR_TIME, DEFAULTS, Settings, is_secret
from tailguard.model.ids import derived_id

__all__ = [
    "SettingsAnnouncer",
    "announcement_type",
    "job_policy",
    "policy_values",
    "recorded_settings",
    "settings_version",
]


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
    (a what-if) are explicit on top. A key the announcement lacks because its release predates
    the key takes the value that decided as that release did (`BEFORE_THEIR_TIME`)."""
    explicit = {k: announced.settings[k] for k in announced.explicit if k in announced.settings}
    base = {**BEFORE_THEIR_TIME, **announced.settings}
    return Settings({**explicit, **(overrides or {})}, base=base)


class SettingsAnnouncer:
    """Announces `service`'s settings to each job at the record that starts the job for it:
    its `JobSubmitted` for a service that reads events, the detector's `FindingSettings` (the
    first finding of every job) for one that reads findings. A function of that one record: a
    restarted service that folds its input back announces nothing again, and one restarted with
    other settings announces them to the jobs that start after."""

    def __init__(self, service: str, values: Mapping[str, str], explicit: Iterable[str]) -> None:
        self.service = service
        self._type = announcement_type(service)
        self._values = _policy(values)
        self.explicit = tuple(sorted(k for k in explicit if k in self._values))
        self.version = settings_version(self._values, self.explicit)

    @classmethod
    def of(cls, service: str, settings: Settings) -> SettingsAnnouncer:
        """The announcer of a service running with `settings`."""
        return cls(service, policy_values(settings), settings.explicit())

    @classmethod
    def replaying(cls, announced: r.PolicySettings) -> SettingsAnnouncer:
        """An announcer that announces what `announced` did, to the letter: a later release
        with more policy keys still reproduces it (its cores take the new keys' defaults)."""
        return cls(announced.service, announced.settings, announced.explicit)

    def before(self, record: r.Record) -> list[r.Record]:
        """The announcement to send before the outputs for `record`, if it starts a job."""
        if isinstance(record, r.JobSubmitted):
            job_settings = job_policy(record.config)
        elif isinstance(record, r.FindingSettings) and record.service != self.service:
            job_settings = dict(record.job_settings)
        else:
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
                job_settings=job_settings,
            )
        ]
