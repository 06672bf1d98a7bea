"""The settings a replay decides with: those the services recorded in the log, when they did.

Each service announces its policy settings to every job before deciding for it
(`model.policy_settings`). A replay takes a service's settings from those announcements, so an
archive replays with no settings file at all, and nothing outside the log can make an audit
pass or fail. A service that restarted with other settings announced the new version to the
jobs that started after (the topics hold several jobs); the replay does what the restarted
service did: at the record that caused the new version's first announcement, it builds the core
again under the new settings and folds the records read so far back into it (the live service
folded its snapshot's). A job that ran across such a restart has only the first version in its
log, so the decisions made after the change show as differences: nothing passes unexplained.

A log whose service announced nothing (written before announcements existed, or a service that
did not run) replays with the settings given, as before; its core's announcements are then left
out, since the log has none to compare with.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tailguard.model import records as r
from tailguard.model.config import Settings
from tailguard.model.policy_settings import SettingsAnnouncer, recorded_settings

__all__ = ["SettingsPlan", "plan_settings", "run_planned"]


class _Core(Protocol):
    def handle(self, record: r.Record) -> list[r.Record]: ...


@dataclass(frozen=True)
class _Phase:
    settings: Settings
    announcer: SettingsAnnouncer | None


@dataclass(frozen=True)
class SettingsPlan:
    """Which settings a service's core is replayed with, and where they change."""

    service: str
    first: _Phase
    # Input record id -> the phase that begins at it (the service restarted with other settings).
    switches: Mapping[str, _Phase] = field(default_factory=dict)
    # The versions recorded, in the order the log first names them; empty: none recorded.
    versions: tuple[str, ...] = ()
    # The settings the service recorded first, without a what-if's (None: none recorded).
    live: Settings | None = None

    @property
    def settings(self) -> Settings:
        """The settings the replay begins with (and keeps, with no change recorded)."""
        return self.first.settings

    @property
    def recorded(self) -> bool:
        return bool(self.versions)

    def describe(self) -> str:
        if not self.versions:
            return f"{self.service}: none recorded, the settings given"
        more = f" (then {', '.join(self.versions[1:])})" if len(self.versions) > 1 else ""
        return f"{self.service}: recorded version {self.versions[0]}{more}"


def plan_settings(
    service: str,
    announced: Iterable[r.PolicySettings],
    given: Settings,
    overrides: Mapping[str, str] | None = None,
) -> SettingsPlan:
    """`service`'s plan from its announcements in log order; `given` when there are none.
    `overrides` (a what-if's settings) go over the recorded ones; the announcements a core
    then makes name the what-if version."""
    first_of: dict[str, r.PolicySettings] = {}
    for a in announced:
        if a.service == service:
            first_of.setdefault(a.version, a)
    if not first_of:
        return SettingsPlan(service, _Phase(given, None))

    def phase(a: r.PolicySettings) -> _Phase:
        settings = recorded_settings(a, overrides)
        announcer = (
            SettingsAnnouncer.of(service, settings) if overrides else SettingsAnnouncer.replaying(a)
        )
        return _Phase(settings, announcer)

    ordered = list(first_of.values())
    switches = {a.caused_by[0]: phase(a) for a in ordered[1:] if a.caused_by}
    live = recorded_settings(ordered[0])
    return SettingsPlan(service, phase(ordered[0]), switches, tuple(first_of), live)


def run_planned(
    plan: SettingsPlan, factory: Callable[[Settings], _Core], inputs: Sequence[r.Record]
) -> list[r.Record]:
    """The outputs of `plan.service`'s core over `inputs`, announcements included when the
    log recorded some."""
    core, announcer = factory(plan.first.settings), plan.first.announcer
    outputs: list[r.Record] = []
    for n, record in enumerate(inputs):
        switch = plan.switches.get(record.id)
        if switch is not None:  # the service restarted with other settings: fold, go on
            core, announcer = factory(switch.settings), switch.announcer
            for earlier in inputs[:n]:
                core.handle(earlier)
        if announcer is not None:
            outputs.extend(announcer.before(record))
        outputs.extend(core.handle(record))
    return outputs
