"""Policy settings: Flink's key names and defaults, typed accessors, no I/O.

Values are kept as strings, exactly as a user writes them in TOML or an environment variable
("1 min", "16 MiB"), and parsed on access, so a `JobSubmitted` record can carry the job's
settings as a plain string map and a replay can override any of them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping

DEFAULTS: dict[str, str] = {
    # FLIP-168 slow task detection
    "slow-task-detector.check-interval": "1 s",
    "slow-task-detector.execution-time.baseline-ratio": "0.75",
    "slow-task-detector.execution-time.baseline-multiplier": "1.5",
    "slow-task-detector.execution-time.baseline-lower-bound": "1 min",
    # tailguard's opt-in second rule (LATE-like, per input byte): an attempt is slow when its
    # time left, at its progress rate, is at least `slowdown` × what a fresh copy would need.
    "slow-task-detector.progress-rate.enabled": "false",
    "slow-task-detector.progress-rate.slowdown": "2",
    "slow-task-detector.progress-rate.min-elapsed": "10 s",
    # ...unless the host's other attempts all read at under this many times the reference time
    # per byte: then the task's own data is slow, not the host, and a copy cannot help; 0: off.
    "slow-task-detector.progress-rate.host-corroboration": "1.5",
    # tailguard's slow-host rule (detector/policy/slow_host.py, docs/policies/detector.md): a
    # host whose attempts read several times slower per input byte than the same vertex's
    # attempts on other hosts is found slow within a few progress reports; the blocklist blocks
    # it at once and its running attempts are copied. "false" (with the two blocklist keys
    # below at 1 and 0 ms) is FLIP-168's rule exactly.
    "slow-task-detector.slow-host.enabled": "true",
    # The median of the host's slowdowns per byte must reach this (noise of +-30% gives 1.86).
    "slow-task-detector.slow-host.slowdown": "2.5",
    # Progress reports with bytes read before an attempt's rate is judged.
    "slow-task-detector.slow-host.min-reports": "3",
    # An attempt's rate is also taken over its recent reads: a window this many times what the
    # vertex's median attempt takes to read the attempt's largest growth between two reports
    # (a node that turns slow mid-attempt shows in a few reads); 0: the average only.
    "slow-task-detector.slow-host.window": "3",
    # Attempts on other hosts (running, or finished) the rate is compared with, at least.
    "slow-task-detector.slow-host.min-peers": "3",
    # How long a finished attempt's slowdown stays evidence for or against its host.
    "slow-task-detector.slow-host.memory": "1 min",
    # FLIP-168 speculative execution and slow-node blocking (Flink 1.16+ key names)
    "execution.batch.speculative.enabled": "true",
    "execution.batch.speculative.max-concurrent-executions": "2",
    "execution.batch.speculative.block-slow-node-duration": "1 min",
    "blocklist.max-blocked-fraction": "0.5",
    # Evidence before a host is blocked: distinct slow subtasks on it within the window (1 and
    # "0 ms": FLIP-168's every-slow-attempt rule). Defaults chosen with `make bench-sim`.
    "blocklist.min-slow-attempts": "2",
    "blocklist.evidence-window": "2 min",
    # Above ±30% noise's widest spread (1.3 / 0.7 = 1.86x the median): docs/policies/blocklist.md.
    "blocklist.evidence-slowdown": "2.0",
    # Whether a job takes the cluster-wide (fleet) blocklist when it starts (model/fleet.py).
    "blocklist.fleet": "true",
    # The order the agent requests slots for a vertex's pending subtasks: "index" (Flink's and
    # Spark's) or "largest-input-first" (most assigned input bytes first; agent/driver/ordering.py).
    "scheduler.subtask-order": "index",
    # FLIP-187 adaptive parallelism (Flink 1.17+ key names)
    "execution.batch.adaptive.auto-parallelism.avg-data-volume-per-task": "16 MiB",
    "execution.batch.adaptive.auto-parallelism.min-parallelism": "1",
    "execution.batch.adaptive.auto-parallelism.max-parallelism": "128",
    "execution.batch.adaptive.auto-parallelism.default-source-parallelism": "0",
    "execution.batch.adaptive.auto-parallelism.normalize-to-power-of-two": "false",
    # 0: broadcast bytes do not count toward V (Flink 2.1); > 0 caps them at ratio·V and takes
    # them off V (tailguard 1.0's rule).
    "execution.batch.adaptive.auto-parallelism.max-broadcast-ratio": "0",
    # "flink-2.1": Flink 2.1's DefaultVertexParallelismAndInputInfosDecider; "optimal":
    # tailguard 1.0's optimal linear partition into exactly ceil(S / V) ranges.
    "decider.algorithm": "flink-2.1",
    # Skewed join splitting (Flink 2.x's adaptive skewed join, its keys and defaults): a join
    # input's subpartition above max(median x factor, threshold) is split along its producer's
    # partitions; strategy auto, forced (the same here) or none (decider/policy/skew.py).
    "table.optimizer.skewed-join-optimization.strategy": "auto",
    "table.optimizer.skewed-join-optimization.skewed-factor": "4.0",
    "table.optimizer.skewed-join-optimization.skewed-threshold": "256 MiB",
    # Two-phase aggregation (Flink's key and values: AUTO, TWO_PHASE, ONE_PHASE): a producer
    # whose consumers all aggregate by its keys aggregates locally before the exchange, so a hot
    # key crosses it as a few partial states (agent/driver/local_aggregation.py).
    "table.optimizer.agg-phase-strategy": "AUTO",
    "decider.timeout": "10 s",
    # Flink 2.0's adaptive broadcast join (FLIP-470, decider/policy/broadcast_join.py): a join
    # side produced under the threshold (Flink's key and default; -1: never) is read broadcast
    # and the other side, unless it had started, not shuffled (a source runs inside the join);
    # strategy auto, runtime_only or none (Flink's values).
    "table.optimizer.join.broadcast-threshold": "1 MiB",
    "table.optimizer.adaptive-broadcast-join.strategy": "auto",
    # FLIP-1 failover and restart limits
    "restart-strategy.type": "exponential-delay",
    "restart-strategy.fixed-delay.attempts": "3",
    "restart-strategy.fixed-delay.delay": "1 s",
    "restart-strategy.exponential-delay.initial-backoff": "1 s",
    "restart-strategy.exponential-delay.max-backoff": "1 min",
    "restart-strategy.exponential-delay.backoff-multiplier": "1.5",
    "restart-strategy.exponential-delay.attempts-before-reset-backoff": "10",
    "restart-strategy.exponential-delay.reset-backoff-threshold": "1 h",
    "restart-strategy.failure-rate.max-failures-per-interval": "1",
    "restart-strategy.failure-rate.failure-rate-interval": "1 min",
    "restart-strategy.failure-rate.delay": "1 s",
    "failover.restart-consumers": "unless-checksum-matches",
    # How long the agent waits for the failover service before restarting a region itself.
    "failover.timeout": "5 s",
    # How long a slot runner lets a cancelled attempt stop by itself before ending its worker.
    "tailguard.runner.cancel-grace": "5 s",
    # Rows per Arrow record batch streamed through an attempt's operators: an attempt holds
    # about this many rows per operator. Flink's key for its Python functions; the value is
    # PySpark's (spark.sql.execution.arrow.maxRecordsPerBatch), because Flink's 1000 makes the
    # per-batch Python call cost more than the rows' work.
    "python.fn-execution.arrow.batch.size": "10000",
}

# FLIP-168's rules exactly (Flink's detector, speculator and every-slow-attempt blocklist), in
# Flink's keys and tailguard's: set these over the defaults to run a job as Flink would. The
# defaults above are tailguard's profile (the slow-host rule and the evidence-based blocklist;
# docs/policies/detector.md and blocklist.md say why each differs).
FLIP_168: dict[str, str] = {
    "slow-task-detector.slow-host.enabled": "false",
    "slow-task-detector.progress-rate.enabled": "false",
    "blocklist.min-slow-attempts": "1",
    "blocklist.evidence-window": "0 ms",
    "blocklist.evidence-slowdown": "0",
}

# Policy keys added after services began to announce their settings, each with the value that
# decides as the services did before it existed: an announcement that lacks one was made by a
# release without it, so its archive replays with that value, not today's default.
BEFORE_THEIR_TIME: dict[str, str] = {
    "blocklist.evidence-slowdown": "0",
}

# Recorded in JobSubmitted.config by the agent: whether the services ran for the job ("on"/"off").
SERVICES_KEY = "tailguard.services"

# The `tailguard.*` markers a JobSubmitted record may carry besides the policy settings. An
# explicit allow-list: a new `tailguard.*` setting (a directory, an endpoint, a key) stays out of
# the record until someone decides it belongs there.
RECORDED_MARKERS: frozenset[str] = frozenset({SERVICES_KEY})

# What a redacted secret is shown as.
REDACTED = "<redacted>"

# Secret keys, matched anywhere in the key (`kafka.sasl.password`, `kafka.producer.sasl.password`,
# `schema-registry.basic.auth.user.info` all match): any password, secret or token; the
# librdkafka and Schema Registry settings that hold credentials or private key material; and any
# key whose last part names a key or keys (`s3.access-key`, `s3.secret-key`,
# `security.command-signing.key`, `...previous-keys`, `ssl_key`) - but not `ssl.key.location`,
# a path.
_SECRET_WORDS = re.compile(r"passw(or)?d|secret|token|credential")
_SECRET_SETTINGS = (
    "basic.auth.user.info",  # Schema Registry: "user:password"
    "sasl.jaas.config",  # Java clients' form, which holds the password
    "sasl.oauthbearer.config",  # librdkafka: may hold an unsecured JWT or client credentials
    "sasl.oauthbearer.assertion.private.key.pem",  # private keys themselves (paths to key
    "ssl.key.pem",  # files, such as ssl.key.location, are not secret)
)
_KEY_NAME = re.compile(r"(^|[._-])keys?$")

_DURATION_UNITS_MS: dict[str, float] = {
    "ms": 1,
    "milli": 1,
    "millis": 1,
    "millisecond": 1,
    "milliseconds": 1,
    "s": 1000,
    "sec": 1000,
    "secs": 1000,
    "second": 1000,
    "seconds": 1000,
    "m": 60_000,
    "min": 60_000,
    "mins": 60_000,
    "minute": 60_000,
    "minutes": 60_000,
    "h": 3_600_000,
    "hour": 3_600_000,
    "hours": 3_600_000,
    "d": 86_400_000,
    "day": 86_400_000,
    "days": 86_400_000,
}

_SIZE_UNITS: dict[str, int] = {
    "b": 1,
    "bytes": 1,
    "k": 1 << 10,
    "kb": 1 << 10,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mb": 1 << 20,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gb": 1 << 30,
    "gib": 1 << 30,
    "t": 1 << 40,
    "tb": 1 << 40,
    "tib": 1 << 40,
}

_NUMBER_WITH_UNIT = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def is_secret(key: str) -> bool:
    """Whether the value of setting `key` is a secret that must never be printed, logged,
    published or archived. One definition for the whole code base."""
    lowered = key.lower()
    if _SECRET_WORDS.search(lowered) or _KEY_NAME.search(lowered):
        return True
    return any(lowered == s or lowered.endswith("." + s) for s in _SECRET_SETTINGS)


def redacted(values: Mapping[str, str]) -> dict[str, str]:
    """`values` with every secret value replaced by `REDACTED`: what may be shown of settings."""
    return {k: REDACTED if is_secret(k) else v for k, v in values.items()}


def recorded_config(values: Mapping[str, str]) -> dict[str, str]:
    """The part of `values` a `JobSubmitted` record may carry: the policy settings (the keys of
    `DEFAULTS`, which a replay applies per job) and the allowed `tailguard.*` markers. Never
    connection settings (brokers, registries, storage, their credentials): they say nothing
    about a decision, and the log is read by more people than the settings file."""
    return {k: v for k, v in values.items() if k in DEFAULTS or k in RECORDED_MARKERS}


class ConfigError(ValueError):
    """A setting that is unknown or cannot be parsed; the message names the key and value."""


_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def parse_flag(text: str) -> bool | None:
    """A boolean setting's value (true/yes/on/1, false/no/off/0, any case), or None if it is
    neither: the caller decides whether that is an error or the default."""
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    return None


def parse_duration_ms(text: str, bare_unit: str = "ms") -> int:
    """'1 min' -> 60000: the one duration parser.

    A bare number is in `bare_unit`: milliseconds for every setting and for `tailguard blocklist
    add --for`, as in Flink (`TimeUtils.parseDuration`); seconds for `tailguard cluster
    throttle --for`, which has always read a bare number so (`cluster/throttle.py`). Each caller
    keeps the unit its inputs always had, so an old settings file or command means what it meant.
    """
    if bare_unit.lower() not in _DURATION_UNITS_MS:
        raise ValueError(f"unknown unit for a bare number: {bare_unit!r}")
    match = _NUMBER_WITH_UNIT.match(text)
    if not match:
        raise ConfigError(f"not a duration: {text!r} (expected e.g. '500 ms', '1 s', '1 min')")
    number, unit = match.groups()
    factor = _DURATION_UNITS_MS.get(unit.lower() or bare_unit.lower())
    if factor is None:
        raise ConfigError(f"unknown duration unit {unit!r} in {text!r}")
    return round(float(number) * factor)


def parse_size_bytes(text: str) -> int:
    """'16 MiB' -> 16777216. Units are binary, as Flink's MemorySize; a bare number is bytes."""
    match = _NUMBER_WITH_UNIT.match(text)
    if not match:
        raise ConfigError(f"not a size: {text!r} (expected e.g. '16 MiB', '512 kb')")
    number, unit = match.groups()
    factor = _SIZE_UNITS.get(unit.lower() or "b")
    if factor is None:
        raise ConfigError(f"unknown size unit {unit!r} in {text!r}")
    return math.floor(float(number) * factor)


class Settings(Mapping[str, str]):
    """An immutable view of settings over the defaults, with typed accessors.

    Unknown keys are accepted (other components may define their own, e.g. Kafka client
    settings), but the typed accessors only read keys that have a default, so a typo in a
    policy key is caught the first time the policy reads it.
    """

    __slots__ = ("_base", "_explicit", "_values")

    def __init__(
        self, overrides: Mapping[str, str] | None = None, base: Mapping[str, str] | None = None
    ) -> None:
        """`base` stands in for `DEFAULTS` under the overrides: the values a service recorded
        for the keys it did not set (a replay of its log decides with those, not with another
        release's defaults)."""
        self._base = DEFAULTS if base is None else {**DEFAULTS, **base}
        values = dict(self._base)
        self._explicit = {str(k): str(v) for k, v in (overrides or {}).items()}
        values.update(self._explicit)
        self._values = values

    def __getitem__(self, key: str) -> str:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        # Secrets redacted: a Settings object ends up in tracebacks, logs and debug prints.
        return f"Settings({redacted(self.overrides())!r})"

    def merged(self, overrides: Mapping[str, str] | None) -> Settings:
        """These settings with `overrides` on top (later wins)."""
        if not overrides:
            return self
        return Settings({**self._values, **overrides})

    def for_job(self, job_config: Mapping[str, str]) -> Settings:
        """The settings for one job: the job's own config (from `JobSubmitted`) over the
        defaults, and this instance's explicit settings over both, so an operator's (or a
        what-if replay's) configuration wins over what a job asked for."""
        job = {str(k): str(v) for k, v in job_config.items()}
        return Settings({**job, **self._explicit}, self._base)

    def explicit(self) -> dict[str, str]:
        """The settings given explicitly (a file, the environment), whatever their values:
        they win over a job's config (`for_job`)."""
        return dict(self._explicit)

    def overrides(self) -> dict[str, str]:
        """The settings that differ from the defaults."""
        return {k: v for k, v in self._values.items() if DEFAULTS.get(k) != v}

    def _raw(self, key: str) -> str:
        if key not in DEFAULTS:
            raise ConfigError(f"unknown setting {key!r}")
        return self._values[key]

    def duration_ms(self, key: str) -> int:
        try:
            return parse_duration_ms(self._raw(key))
        except ConfigError as err:
            raise ConfigError(f"{key}: {err}") from None

    def size_bytes(self, key: str) -> int:
        try:
            return parse_size_bytes(self._raw(key))
        except ConfigError as err:
            raise ConfigError(f"{key}: {err}") from None

    def integer(self, key: str) -> int:
        raw = self._raw(key)
        try:
            return int(raw.strip())
        except ValueError:
            raise ConfigError(f"{key}: not an integer: {raw!r}") from None

    def number(self, key: str) -> float:
        raw = self._raw(key)
        try:
            return float(raw.strip())
        except ValueError:
            raise ConfigError(f"{key}: not a number: {raw!r}") from None

    def flag(self, key: str) -> bool:
        raw = self._raw(key)
        value = parse_flag(raw)
        if value is None:
            raise ConfigError(f"{key}: not a boolean: {raw.strip()!r}")
        return value

    def text(self, key: str) -> str:
        return self._raw(key).strip()
