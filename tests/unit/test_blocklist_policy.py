"""BlocklistTracker: which hosts, for how long, and never too many."""

from __future__ import annotations

from speculation_histories import slow_finding

from tailguard.blocklist.policy import BlocklistTracker
from tailguard.model.config import Settings
from tailguard.model.ids import derived_id
from tailguard.model.records import BlockNodes, Record, SlowAttempt, SlowSubtask, UnblockNodes

MIN = 60_000
HOSTS = tuple(f"h{i}" for i in range(6))


def slow_on(n: int, *attempts: tuple[str, bool]) -> SlowSubtask:
    """Subtask `n` with live attempts on the given hosts, each (host, is slow)."""
    live = tuple(
        SlowAttempt(a, host, 90_000, None, a > 0, slow) for a, (host, slow) in enumerate(attempts)
    )
    return SlowSubtask(n, live, len(attempts) - 1)


def blocks(records: list[Record]) -> list[tuple[tuple[str, ...], int]]:
    return [(r.hosts, r.until_ts) for r in records if isinstance(r, BlockNodes)]


def test_hosts_of_slow_attempts_only_are_blocked_for_the_duration() -> None:
    tracker = BlocklistTracker(Settings())
    finding = slow_finding(
        slow_on(0, ("h1", True), ("h2", False)), slow_on(1, ("h3", True)), ts=1000, hosts=HOSTS
    )
    out = tracker.handle(finding)
    assert blocks(out) == [(("h1", "h3"), 1000 + MIN)]
    assert out[0].id == derived_id("blocklist", finding.id, "h1", "h3")
    assert out[0].caused_by == (finding.id,)
    assert tracker.metrics()["blockedHosts"] == 2


def test_a_block_is_extended_but_re_emitted_only_after_half_the_duration() -> None:
    tracker = BlocklistTracker(Settings())
    slow = slow_on(0, ("h1", True))
    assert blocks(tracker.handle(slow_finding(slow, ts=0, hosts=HOSTS))) == [(("h1",), MIN)]
    assert tracker.handle(slow_finding(slow, ts=MIN // 2 - 1, hosts=HOSTS)) == []
    assert blocks(tracker.handle(slow_finding(slow, ts=MIN // 2, hosts=HOSTS))) == [
        (("h1",), MIN // 2 + MIN)
    ]
    assert tracker.metrics()["blocksIssued"] == 2
    assert tracker.metrics()["hostsBlocked"] == 1


def test_blocks_expire_with_finding_time() -> None:
    tracker = BlocklistTracker(Settings())
    tracker.handle(slow_finding(slow_on(0, ("h1", True)), ts=0, hosts=HOSTS))
    assert tracker.metrics()["blockedHosts"] == 1
    tracker.handle(slow_finding(ts=MIN, hosts=HOSTS))
    assert tracker.metrics()["blockedHosts"] == 0
    # Expired, so blocking it again is a fresh block, whatever the half-duration rule says.
    out = tracker.handle(slow_finding(slow_on(0, ("h1", True)), ts=MIN + 1, hosts=HOSTS))
    assert blocks(out) == [(("h1",), 2 * MIN + 1)]


def test_never_more_than_the_fraction_most_slow_attempts_first_then_by_name() -> None:
    tracker = BlocklistTracker(Settings())  # 0.5 of 6 hosts: 3
    finding = slow_finding(
        slow_on(0, ("h5", True)),
        slow_on(1, ("h4", True)),
        slow_on(2, ("h4", True)),
        slow_on(3, ("h2", True)),
        slow_on(4, ("h3", True)),
        hosts=HOSTS,
    )
    assert blocks(tracker.handle(finding)) == [(("h2", "h3", "h4"), MIN)]
    assert tracker.metrics()["hostsSkippedByFraction"] == 1  # h5
    # The limit holds across findings too.
    assert tracker.handle(slow_finding(slow_on(0, ("h0", True)), ts=1, hosts=HOSTS)) == []


def test_never_all_hosts_even_with_fraction_one() -> None:
    tracker = BlocklistTracker(Settings({"blocklist.max-blocked-fraction": "1.0"}))
    finding = slow_finding(slow_on(0, ("a", True)), slow_on(1, ("b", True)), hosts=("a", "b"))
    assert blocks(tracker.handle(finding)) == [(("a",), MIN)]


def test_a_shrinking_cluster_lifts_blocks_to_stay_under_the_fraction() -> None:
    tracker = BlocklistTracker(Settings())
    tracker.handle(slow_finding(slow_on(0, ("h1", True)), ts=0, hosts=HOSTS))
    tracker.handle(slow_finding(slow_on(0, ("h2", True)), ts=10, hosts=HOSTS))
    out = tracker.handle(slow_finding(ts=20, hosts=("h1", "h2", "h3")))  # limit now 1
    assert [(type(r), r.hosts) for r in out if isinstance(r, UnblockNodes)] == [
        (UnblockNodes, ("h1",))  # the block ending first goes
    ]
    assert tracker.metrics()["blockedHosts"] == 1
