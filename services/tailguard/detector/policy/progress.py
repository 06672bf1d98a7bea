"""The progress-rate rule (opt-in): find stragglers from how fast they read, as LATE does.

Flink's rule waits until R of a vertex has finished, so a straggler in a single-wave vertex is
found late or never. LATE (Zaharia et al., OSDI 2008) estimates each running task's time left
from its progress rate. This rule does the same, normalised by input bytes so that a task that
is slow only because it has more data (skew) is not mistaken for a straggler:

- An attempt reports `AttemptProgress` (bytes read of its assigned total) at least every check
  interval. Its **time per byte** is elapsed / bytes read, both at its last report.
- The vertex's **reference time per byte** τ is the median time per byte of its running
  attempts (those with a report, past the minimum elapsed time), or of its finished attempts
  when those are more numerous (late in a vertex the running ones are mostly stragglers).
- **Time left** = (total − read) × elapsed / read − (now − last report): the rest at the rate
  seen so far (+∞ when nothing was read yet).
- **A fresh copy would need** total × τ.
- The attempt is slow when it has run for at least `slow-task-detector.progress-rate.min-elapsed`
  and its time left ≥ `slow-task-detector.progress-rate.slowdown` × what a fresh copy would
  need: the copy would be done long before it. A skewed attempt on a healthy host reads at the
  usual rate, so its time left is about what a copy would need, and it is never flagged.
- **Host corroboration** (LATE's SlowNodeThreshold, turned into evidence): when the host has
  other attempts to judge it by (running ones that have reported past the minimum, and the
  host's last finished one), the attempt is slow only if one of them is at least
  `slow-task-detector.progress-rate.host-corroboration` × τ per byte too. A task whose own
  data is slow per byte (the 1-in-1,000 tail of per-task cost; a copy of it is as slow, since
  the cost goes with the data) has healthy neighbours and is left alone; a slow host slows
  everything it runs. A host with no other evidence gets the benefit of the doubt. 0 turns it
  off. In `make bench-sim` every copy of an only-skewed task the rule made without it was of
  this kind (2 over seeds 1-5), and none is made with it.

Pure: every value comes from the events (`AttemptDeploying`, `AttemptProgress`,
`AttemptFinished`) and the Tick's time, so a replay reaches the same decisions.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from tailguard.model.config import ConfigError, Settings

_KEY = "slow-task-detector.progress-rate."


@dataclass(frozen=True, slots=True)
class ProgressRule:
    enabled: bool
    slowdown: float
    min_elapsed_ms: int
    # The slowdown per byte another attempt on the host must show too; 0: no corroboration.
    host_corroboration: float = 0.0

    @classmethod
    def from_settings(cls, settings: Settings) -> ProgressRule:
        rule = cls(
            enabled=settings.flag(_KEY + "enabled"),
            slowdown=settings.number(_KEY + "slowdown"),
            min_elapsed_ms=settings.duration_ms(_KEY + "min-elapsed"),
            host_corroboration=settings.number(_KEY + "host-corroboration"),
        )
        if rule.slowdown <= 0:
            raise ConfigError(f"{_KEY}slowdown must be positive, got {rule.slowdown}")
        if rule.host_corroboration < 0:
            raise ConfigError(
                f"{_KEY}host-corroboration must be 0 (off) or positive,"
                f" got {rule.host_corroboration}"
            )
        return rule


@dataclass(slots=True)
class Progress:
    """An attempt's last report."""

    ts: int
    bytes_read: int
    bytes_total: int | None


def time_left_ms(now: int, deploying_ts: int, progress: Progress, total: int) -> float:
    """The rest of `total` at the rate seen up to the last report, less the time since it."""
    elapsed = progress.ts - deploying_ts
    if progress.bytes_read <= 0:
        return math.inf
    remaining = max(0, total - progress.bytes_read)
    return remaining * elapsed / progress.bytes_read - (now - progress.ts)


def reference_per_byte(running: list[float], finished: RunningMedian) -> float | None:
    """τ: the median time per byte of the larger population, running or finished."""
    if len(finished) > len(running):
        return finished.median()
    if not running:
        return None
    running.sort()
    middle = len(running) // 2
    if len(running) % 2:
        return running[middle]
    return (running[middle - 1] + running[middle]) / 2


def is_slow(left_ms: float, total: int, tau: float, rule: ProgressRule) -> bool:
    return left_ms >= rule.slowdown * total * tau


def corroborated(peer_slowdowns: list[float], rule: ProgressRule) -> bool:
    """Whether the slowdowns per byte (time per byte / τ) of the host's other attempts leave
    the host as the likely cause: one at least `host_corroboration` is enough, and so is no
    evidence at all (a host of one slot in a single-wave vertex has none, and its straggler
    must still be found); only healthy neighbours clear the host. With the setting 0, always."""
    threshold = rule.host_corroboration
    return threshold <= 0 or not peer_slowdowns or any(s >= threshold for s in peer_slowdowns)


class RunningMedian:
    """Median of a growing multiset (two heaps): O(log n) per value, O(1) per read."""

    __slots__ = ("_high", "_low")

    def __init__(self) -> None:
        self._low: list[float] = []  # max-heap (negated)
        self._high: list[float] = []

    def __len__(self) -> int:
        return len(self._low) + len(self._high)

    def add(self, value: float) -> None:
        if self._low and value > -self._low[0]:
            heapq.heappush(self._high, value)
        else:
            heapq.heappush(self._low, -value)
        if len(self._low) > len(self._high) + 1:
            heapq.heappush(self._high, -heapq.heappop(self._low))
        elif len(self._high) > len(self._low):
            heapq.heappush(self._low, -heapq.heappop(self._high))

    def median(self) -> float | None:
        if not self._low:
            return None
        if len(self._low) > len(self._high):
            return -self._low[0]
        return (-self._low[0] + self._high[0]) / 2
