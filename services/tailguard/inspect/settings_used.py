"""The settings a decision core reads, found by running it, not from a list that could drift.

The core is built over a `Settings` that notes every key a typed accessor reads, and is fed the
job's recorded input, as `tailguard replay` feeds it. A key read while the core is built comes
from the service's own settings; a key read through `Settings.for_job` comes from the job's
`JobSubmitted.config` over the defaults. When the service announced its settings to the job
(`model.policy_settings`), the core is built over those, as a replay builds it, and the values
shown are the ones it decided with. Pure: the cores are pure functions of their input.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tailguard.inspect.history import History
from tailguard.model import records as r
from tailguard.model.config import Settings
from tailguard.model.policy_settings import recorded_settings
from tailguard.replay.engine import dedupe
from tailguard.system.services import SERVICES

JOB = "job"
SERVICE = "service"


class _KeyRecorder(Settings):
    """Settings that note which keys are read, and whether through `for_job`."""

    __slots__ = ("_reads", "_scope")

    def __init__(
        self,
        overrides: Mapping[str, str],
        reads: dict[str, set[str]],
        scope: str,
        base: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(overrides, base)
        self._reads = reads
        self._scope = scope

    # Every typed accessor (duration_ms, integer, flag, ...) reads through `_raw`.
    def _raw(self, key: str) -> str:
        self._reads.setdefault(key, set()).add(self._scope)
        return super()._raw(key)

    def for_job(self, job_config: Mapping[str, str]) -> Settings:
        return _KeyRecorder({**job_config, **self._explicit}, self._reads, JOB, self._base)

    def merged(self, overrides: Mapping[str, str] | None) -> Settings:
        values = {**self._values, **(overrides or {})}
        return _KeyRecorder(values, self._reads, self._scope, self._base)


@dataclass(frozen=True, slots=True)
class SettingUsed:
    key: str
    value: str
    # "job config" (JobSubmitted.config), "service" (its own settings, as it recorded them) or
    # "default"
    source: str
    scope: str  # JOB: read per job from JobSubmitted.config; SERVICE: the service's own settings


@dataclass(frozen=True, slots=True)
class ServiceSettings:
    service: str
    settings: tuple[SettingUsed, ...]
    # Set when the core could not be run over the job's records (the keys may be incomplete).
    problem: str = ""
    # The version of the settings the service announced to the job; empty: none recorded.
    version: str = ""


def services() -> tuple[str, ...]:
    return tuple(spec.name for spec in SERVICES)


def settings_used(service: str, history: History) -> ServiceSettings:
    """The keys `service`'s core reads on this job's records, with the job's values."""
    spec = next((s for s in SERVICES if s.name == service), None)
    if spec is None:
        raise ValueError(f"no decision core named {service!r} (known: {', '.join(services())})")
    config = history.config()
    announced = next(
        (
            e.record
            for e in history.entries
            if isinstance(e.record, r.PolicySettings) and e.record.service == service
        ),
        None,
    )
    service_set = set(announced.explicit) if announced is not None else set()
    recorded = recorded_settings(announced) if announced is not None else Settings()
    base = announced.settings if announced is not None else None
    reads: dict[str, set[str]] = {}
    problem = ""
    try:
        core = spec.core(_KeyRecorder(recorded.explicit(), reads, SERVICE, base))
        for record in dedupe(e.record for e in history.entries if e.topic == spec.input_topic):
            core.handle(record)
    except Exception as err:  # a record the core trips over: say so, keep what was read
        problem = f"the {service} core stopped on this job's records: {err!r}"
    effective = recorded.for_job(config)
    used = tuple(
        SettingUsed(
            key,
            effective[key],
            "service" if key in service_set else "job config" if key in config else "default",
            # A key the core reads per job follows the job's config (a core may also read it
            # once at start for a fallback, which does not apply to this job).
            JOB if JOB in scopes else SERVICE,
        )
        for key, scopes in sorted(reads.items())
    )
    return ServiceSettings(service, used, problem, announced.version if announced else "")
