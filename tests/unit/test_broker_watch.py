"""BrokerWatch.lost_within: only a loss of the broker counts, not the watch's own start (the
worker takes a failed stream within that window for a reconnect and starts itself again)."""

from __future__ import annotations

from tailguard.shell.broker_watch import BrokerWatch


def test_lost_within_counts_a_loss_not_the_start() -> None:
    now = [100.0]
    # Nothing listens on port 1: every probe fails.
    watch = BrokerWatch({"bootstrap.servers": "127.0.0.1:1"}, timeout_s=0.2, clock=lambda: now[0])
    assert not watch.lost_within(120.0)  # reachable as far as it knows, and never lost
    assert not watch.probe().reachable
    assert watch.lost_within(120.0)
    watch._changed(True, "")  # back
    now[0] += 60.0
    assert watch.lost_within(120.0)
    now[0] += 61.0
    assert not watch.lost_within(120.0)
