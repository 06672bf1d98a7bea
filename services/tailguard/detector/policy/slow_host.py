"""The slow-host rule (tailguard's default): find a slow host from its attempts' read rates.

Flink's rule waits until R of a vertex has finished, and Spark's until a quantile of its tasks
has, so a host that reads at a fifth of its peers' rate is found late, or never when its first
attempt ends before the check. Each running attempt reports its progress (`AttemptProgress`)
every check interval, and from the first reports its rate per input byte says whether its host
keeps up with the hosts running the same vertex. This rule compares those rates.

- **An attempt's time per byte**: (last report ts − deploying ts) / bytes read. Per input byte,
  so a task that is slow only because it has more data reads at the usual rate and is not
  evidence against its host (skew). An attempt is **judged** once it has made
  `slow-task-detector.slow-host.min-reports` reports with bytes read (its rate is then an
  average over that many intervals, not one report's jitter); reports with nothing read yet do
  not count (a worker still starting is not measured).
- **Its recent windows** (`…slow-host.window`): the average since deploying hides a node that
  turns slow in the middle of a long attempt until the slow part outweighs the healthy one. So
  an attempt is also read over each window ending at its last report that starts where its
  reads grew and spans at least `window` times what the vertex's median attempt takes to read
  the attempt's largest growth; each counts one grain (its smallest growth, a batch) more than
  was reported (`ReadHistory`).
- **Its peers**: the judged running attempts of its vertex on *other* hosts, or the vertex's
  finished attempts when those are more numerous. Their **median** time per byte is the
  reference: the median does not move however slow a minority of peers (the slow host's other
  attempts, or several slow hosts) is. At least `…slow-host.min-peers` peers are needed.
  Against running peers an attempt's time per byte is the larger of its average and its
  windows'; against finished ones, the larger of its windows' and a lower bound of its whole
  figure (`ReadHistory.projected_per_byte`): a finished attempt spread its start over all its
  input, a young one's average spreads its start over the part it has read.
- **Cold attempts** (deployed on a host that had finished no attempt of the job: they pay the
  worker's start) are compared with cold peers only, running or finished; a warm one with all
  (a cold peer can only make it look faster). A host that joins late is not condemned for its
  start.
- **An attempt that has read all its input** and still runs (processing it) has no rate any
  more; its time per byte is at least (now − deploying) / total, which over the vertex's
  finished median is evidence like a finished attempt's. It is no peer.
- **Its slowdown** = its time per byte / the reference. A finished attempt gets one too, when it
  finishes (its whole time over its input bytes, against the vertex's finished median, or the
  reference of the vertex's last check while fewer than `min-peers` have finished), and it stays
  evidence for `…slow-host.memory`.
- **A host is found slow** when the lower median of its evidence (the slowdowns of its judged
  running attempts in every vertex, and of its finished attempts within the memory) is at least
  `…slow-host.slowdown`: more than half of its evidence is that slow. A majority verdict: a host
  with one slow task and as many healthy ones (a task whose own data is slow per byte) is not
  found slow; a host with a single piece of evidence is judged by it. Its running attempts not
  judged yet count as evidence for it (never against) while they read at under the slowdown,
  so that its first attempt to be judged is not its only voice while its neighbours' reports
  lag.

**Noise never trips it.** If every attempt's time per byte is within ±30% of one common value,
any slowdown is at most 1.3 / 0.7 ≈ 1.86 (the reference is a median of values within the same
band), and so is every piece of a host's evidence: below the default threshold 2.5 with a 35%
margin, whatever the number of reports. A window, read with the batch in flight counted, is
no slower than the attempt's true rate, so it keeps the bound however many are read. A real
slow node (the 5× node of issue 24) is far above
it from its first reports.

Pure: every value comes from the events and the time of the event that triggers the check (a
Tick, or a report that shows a new slow host); replay reaches the same verdicts.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from tailguard.model.config import ConfigError, Settings

_KEY = "slow-task-detector.slow-host."


@dataclass(frozen=True, slots=True)
class SlowHostRule:
    enabled: bool
    slowdown: float
    min_reports: int
    min_peers: int
    memory_ms: int
    # The recent window's length, in the vertex's median times to read this attempt's largest
    # increment; 0: no window (the average since deploying only).
    window: float = 0.0

    @classmethod
    def from_settings(cls, settings: Settings) -> SlowHostRule:
        rule = cls(
            enabled=settings.flag(_KEY + "enabled"),
            slowdown=settings.number(_KEY + "slowdown"),
            min_reports=settings.integer(_KEY + "min-reports"),
            min_peers=settings.integer(_KEY + "min-peers"),
            memory_ms=settings.duration_ms(_KEY + "memory"),
            window=settings.number(_KEY + "window"),
        )
        if rule.slowdown <= 1:
            raise ConfigError(f"{_KEY}slowdown must be above 1, got {rule.slowdown}")
        if rule.min_reports < 1 or rule.min_peers < 1:
            raise ConfigError(
                f"{_KEY}min-reports and {_KEY}min-peers must be at least 1,"
                f" got {rule.min_reports} and {rule.min_peers}"
            )
        if rule.window < 0:
            raise ConfigError(f"{_KEY}window must be 0 (off) or positive, got {rule.window}")
        return rule


class ReadHistory:
    """An attempt's reads, as the points where its reported bytes grew: (report ts, bytes).
    Only growth is kept, so a stalled attempt costs nothing per report, and the last `KEPT`
    points are enough for any window the rule asks (a few increments). A window starts at a
    point of growth, never at deploying: it holds reading only, not the attempt's start."""

    KEPT: ClassVar[int] = 16
    __slots__ = ("deploying_ts", "fastest", "first", "grain", "largest", "points")

    def __init__(self, deploying_ts: int) -> None:
        self.deploying_ts = deploying_ts
        self.points: deque[tuple[int, int]] = deque(maxlen=self.KEPT)
        # The first point of growth (kept when the deque drops it): where its reading began to
        # show, after whatever start it paid.
        self.first: tuple[int, int] | None = None
        # The smallest growth between two reports: the read's grain. Reads arrive in batches
        # (an Arrow record batch, a row group; about one size per attempt), so a report lags the
        # work by less than one, and a growth is one batch or more.
        self.grain = 0
        # The largest growth: what one report interval (or batch) can bring, the unit a window's
        # length is counted in.
        self.largest = 0
        # The fastest pace (time per byte) it has shown: between two growths, or from deploying
        # to its first (a start included: never faster than it read, so still a pace it reached
        # at least). Kept as reports come, for `reading_end`, which every check asks.
        self.fastest: float | None = None

    def report(self, ts: int, bytes_read: int) -> None:
        since = self.points[-1] if self.points else (self.deploying_ts, 0)
        growth = bytes_read - since[1]
        if growth > 0:
            pace = (ts - since[0]) / growth
            self.fastest = pace if self.fastest is None else min(self.fastest, pace)
            self.grain = min(self.grain, growth) if self.grain else growth
            self.largest = max(self.largest, growth)
            self.points.append((ts, bytes_read))
            if self.first is None:
                self.first = (ts, bytes_read)

    def reading_at(self, ts: int) -> bool:
        """Whether its reads grew at the report of `ts`, and at least once before: its average
        since deploying is then a reading rate. One whose reads have stopped may be processing
        all it read, or stalled, and without its size nothing tells which."""
        return len(self.points) >= 2 and self.points[-1][0] == ts

    def reading_end(self) -> int | None:
        """When its reads of what it had read at its last growth ended, at the earliest its
        pace allows: the report before that growth showed less, so they ended after it, and
        the last growth took at least what it would at the fastest pace the attempt has shown
        (between two growths, or from deploying to its first). A report interval after the
        reads ended (a task that processes what it read, reported once a heartbeat) no longer
        counts as reading, while a steady reader's last growth takes its whole interval and
        ends at its report. None before two growths: nothing bounds when the first one ended."""
        if len(self.points) < 2 or self.fastest is None:
            return None
        (prev_ts, prev_read), (last_ts, last_read) = self.points[-2], self.points[-1]
        return min(last_ts, prev_ts + math.ceil((last_read - prev_read) * self.fastest))

    def reading_per_byte(self) -> float | None:
        """Its average since deploying while it read (to `reading_end`): what a running peer's
        average is, for an attempt that has finished, whose whole figure holds whatever it did
        after its reads too. Taken at the report of its last growth, it overstated the reading
        by up to a report interval: a Spark task that read its input in 0.9 s, reported every
        2 s, was found 2.5x slow against its peers with no noise at all (the noise property,
        with 4,000 examples). None before two growths."""
        end = self.reading_end()
        if end is None:
            return None
        return (end - self.deploying_ts) / self.points[-1][1]

    def _window(self, start: tuple[int, int], now_ts: int, bytes_read: int) -> float:
        """Time per byte from a point of growth to the last report, counting one grain more than
        was reported: the most favourable reading, so that a report's lag behind the work (a
        batch half read) never makes an attempt look slower than it is."""
        return (now_ts - start[0]) / (bytes_read - start[1] + self.grain)

    def projected_per_byte(self, now_ts: int, bytes_read: int, total: int) -> float | None:
        """A lower bound of the attempt's whole time per byte when it finishes, the figure a
        finished attempt has: the time so far (its start included, once), and the rest of
        `total` at the most favourable rate its reading has shown since it first grew (one
        grain less left). None before any growth."""
        if self.first is None or total <= 0:
            return None
        rate = self._window(self.first, now_ts, bytes_read)
        left = max(0, total - bytes_read - self.grain)
        return (now_ts - self.deploying_ts + left * rate) / total

    def recent_per_byte(self, now_ts: int, bytes_read: int, span: float) -> float | None:
        """The largest time per byte (`_window`) over the windows of at least `span` ms that
        end at the last report (`now_ts`, `bytes_read`). The window that starts where the
        attempt slowed down shows it most; which one that is nobody knows, so all are read
        (each is bounded by the same noise). None when no point is that old."""
        worst = None
        for point in self.points:
            if now_ts - point[0] < span:
                break  # oldest first: the rest are younger
            per_byte = self._window(point, now_ts, bytes_read)
            if worst is None or per_byte > worst:
                worst = per_byte
        return worst


def median_of_sorted(values: Sequence[float]) -> float | None:
    n = len(values)
    if n == 0:
        return None
    middle = n // 2
    if n % 2:
        return values[middle]
    return (values[middle - 1] + values[middle]) / 2


def _kth_without(values: Sequence[float], removed: Sequence[float], k: int) -> float:
    """The k-th smallest (0-based) of `values` less the sub-multiset `removed` (both sorted):
    the first value v with more than k of the rest at or below it, found by bisection."""
    low, high = 0, len(values) - 1
    while low < high:
        middle = (low + high) // 2
        v = values[middle]
        if bisect_right(values, v) - bisect_right(removed, v) > k:
            high = middle
        else:
            low = middle + 1
    return values[low]


def median_without(values: Sequence[float], removed: Sequence[float]) -> float | None:
    """Median of `values` (sorted) without `removed` (sorted, a sub-multiset of `values`), in
    O(log² n): a host's peers are the vertex's attempts less its own, and a Tick asks this for
    every host of a vertex, so copying the list per host would be quadratic in the hosts."""
    n = len(values) - len(removed)
    if n <= 0:
        return None
    upper = _kth_without(values, removed, n // 2)
    if n % 2:
        return upper
    return (_kth_without(values, removed, n // 2 - 1) + upper) / 2


def slowdown(per_byte: float, reference: float) -> float | None:
    """Time per byte over the reference; None when it says nothing (no positive reference)."""
    if not reference > 0 or math.isinf(reference):
        return None
    return per_byte / reference


def found_slow(evidence: Iterable[float], rule: SlowHostRule) -> bool:
    """The verdict on one host: the lower median of its evidence reaches the rule's slowdown
    (more than half of it does)."""
    ordered = sorted(evidence)
    return bool(ordered) and ordered[(len(ordered) - 1) // 2] >= rule.slowdown
