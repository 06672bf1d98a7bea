"""Flink's restart strategies (RestartBackoffTimeStrategy), on event time.

Each strategy is told about every failover in order and answers with the earliest time the
restart may happen, or None when the job must fail. The arithmetic follows Flink's
`FixedDelayRestartBackoffTimeStrategy`, `FailureRateRestartBackoffTimeStrategy` and (Flink 1.19+)
`ExponentialDelayRestartBackoffTimeStrategy`, without jitter: a decision must be a pure function
of the log.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from tailguard.model.config import ConfigError, Settings


class RestartBackoff(Protocol):
    def on_failure(self, ts: int) -> int | None:
        """A failover at `ts`: the not-before time of the restart, or None to fail the job."""
        ...

    def exhausted_reason(self) -> str:
        """Why the last `on_failure` said no, naming the strategy and its counts."""
        ...


class NoRestart:
    """`restart-strategy.type = none`: the first failure fails the job."""

    def on_failure(self, ts: int) -> int | None:
        return None

    def exhausted_reason(self) -> str:
        return "restart-strategy none: restarts are disabled"


class FixedDelayRestart:
    """At most `attempts` restarts, each `delay` after its failure."""

    def __init__(self, attempts: int, delay_ms: int) -> None:
        self.attempts = attempts
        self.delay_ms = delay_ms
        self.failures = 0

    def on_failure(self, ts: int) -> int | None:
        self.failures += 1
        if self.failures > self.attempts:
            return None
        return ts + self.delay_ms

    def exhausted_reason(self) -> str:
        return (
            f"restart-strategy fixed-delay: failure {self.failures} after "
            f"{self.attempts} restarts (restart-strategy.fixed-delay.attempts={self.attempts})"
        )


class FailureRateRestart:
    """Fail when more than `max_failures` failures fall within `interval` (Flink keeps the last
    max_failures + 1 failure times and fails when the oldest is not older than the interval)."""

    def __init__(self, max_failures: int, interval_ms: int, delay_ms: int) -> None:
        self.max_failures = max_failures
        self.interval_ms = interval_ms
        self.delay_ms = delay_ms
        self.times: deque[int] = deque()

    def on_failure(self, ts: int) -> int | None:
        if len(self.times) > self.max_failures:
            self.times.popleft()
        self.times.append(ts)
        if len(self.times) > self.max_failures and ts - self.times[0] <= self.interval_ms:
            return None
        return ts + self.delay_ms

    def exhausted_reason(self) -> str:
        return (
            f"restart-strategy failure-rate: {len(self.times)} failures within "
            f"{self.times[-1] - self.times[0]} ms, more than "
            f"restart-strategy.failure-rate.max-failures-per-interval={self.max_failures} per "
            f"{self.interval_ms} ms"
        )


class ExponentialDelayRestart:
    """Backoff initial * multiplier^n capped at max; failures while a restart is still pending
    merge into that restart; the count resets after `reset_threshold` without failures; more
    than `attempts_before_reset` restarts in a row fail the job (Flink 1.19 semantics)."""

    def __init__(
        self,
        initial_ms: int,
        max_ms: int,
        multiplier: float,
        reset_threshold_ms: int,
        attempts_before_reset: int,
    ) -> None:
        self.initial_ms = initial_ms
        self.max_ms = max_ms
        self.multiplier = multiplier
        self.reset_threshold_ms = reset_threshold_ms
        self.attempts_before_reset = attempts_before_reset
        self.attempt = 0
        self.next_restart_ts: int | None = None

    def on_failure(self, ts: int) -> int | None:
        if self.next_restart_ts is not None and ts <= self.next_restart_ts:
            # Tasks are already waiting to restart: this failure joins that restart.
            return self.next_restart_ts
        if self.next_restart_ts is None or ts - self.next_restart_ts >= self.reset_threshold_ms:
            self.attempt = 0
        backoff = int(self.initial_ms * self.multiplier**self.attempt)
        self.next_restart_ts = ts + max(self.initial_ms, min(backoff, self.max_ms))
        self.attempt += 1
        if self.attempt > self.attempts_before_reset:
            return None
        return self.next_restart_ts

    def exhausted_reason(self) -> str:
        return (
            f"restart-strategy exponential-delay: failure {self.attempt} since the last reset, "
            f"over restart-strategy.exponential-delay.attempts-before-reset-backoff="
            f"{self.attempts_before_reset}"
        )


_ALIASES = {
    "fixed-delay": "fixed-delay",
    "fixeddelay": "fixed-delay",
    "failure-rate": "failure-rate",
    "failurerate": "failure-rate",
    "exponential-delay": "exponential-delay",
    "exponentialdelay": "exponential-delay",
    "none": "none",
    "off": "none",
    "disable": "none",
}


def restart_backoff(settings: Settings) -> RestartBackoff:
    """The strategy `restart-strategy.type` names, configured from `restart-strategy.*`."""
    raw = settings.text("restart-strategy.type")
    kind = _ALIASES.get(raw.lower())
    if kind == "none":
        return NoRestart()
    if kind == "fixed-delay":
        return FixedDelayRestart(
            settings.integer("restart-strategy.fixed-delay.attempts"),
            settings.duration_ms("restart-strategy.fixed-delay.delay"),
        )
    if kind == "failure-rate":
        return FailureRateRestart(
            settings.integer("restart-strategy.failure-rate.max-failures-per-interval"),
            settings.duration_ms("restart-strategy.failure-rate.failure-rate-interval"),
            settings.duration_ms("restart-strategy.failure-rate.delay"),
        )
    if kind == "exponential-delay":
        prefix = "restart-strategy.exponential-delay."
        return ExponentialDelayRestart(
            settings.duration_ms(prefix + "initial-backoff"),
            settings.duration_ms(prefix + "max-backoff"),
            settings.number(prefix + "backoff-multiplier"),
            settings.duration_ms(prefix + "reset-backoff-threshold"),
            settings.integer(prefix + "attempts-before-reset-backoff"),
        )
    raise ConfigError(f"restart-strategy.type: unknown strategy {raw!r}")
