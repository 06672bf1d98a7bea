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


def test_a_broker_replaced_faster_than_a_probe_counts_as_lost(tmp_path) -> None:
    """A mock broker killed and restarted on its port between two probes looks reachable
    throughout; its new cluster id is what says its log is new (Apache Kafka's keeps its id and
    its log) (the chaos suite's broker case:
    no service noticed, none started again, and every decision after the restart was missing)."""
    import os
    import signal

    from tailguard.broker.embedded import EmbeddedBroker
    from tailguard.processes import trees

    broker = EmbeddedBroker(tmp_path, mock=True)
    bootstrap = broker.start()
    try:
        watch = BrokerWatch({"bootstrap.servers": bootstrap}, timeout_s=5.0)
        assert watch.probe().reachable and not watch.lost_within(120.0)
        state = broker.status()
        assert state is not None
        os.kill(state.pid, signal.SIGKILL)
        assert trees.wait_gone([state.pid], 10.0)
        assert broker.start() == bootstrap  # the same address
        assert watch.probe().reachable
        assert watch.lost_within(120.0)
    finally:
        broker.stop()
