"""BrokerWatch, which probes the broker through the service app's own aiokafka client.

lost_within: only a loss of the broker counts, not the watch's own start (the worker takes a
failed stream within that window for a reconnect and starts itself again). A slow probe marks
the broker unreachable but never names it: only an answer's cluster id does, so a real broker
whose handshake outlasts the first probe under load is not taken for the mock broker."""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import AIOKafkaClient

from tailguard.shell.broker_watch import BrokerWatch


def test_lost_within_counts_a_loss_not_the_start() -> None:
    async def check() -> None:
        now = [100.0]
        # Nothing listens on port 1: every probe fails.
        client = AIOKafkaClient(bootstrap_servers="127.0.0.1:1")
        watch = BrokerWatch(lambda: client, timeout_s=5.0, clock=lambda: now[0])
        assert not watch.lost_within(120.0)  # reachable as far as it knows, and never lost
        assert not (await watch.probe()).reachable
        assert watch.lost_within(120.0)
        watch._changed(True, "")  # back
        now[0] += 60.0
        assert watch.lost_within(120.0)
        now[0] += 61.0
        assert not watch.lost_within(120.0)
        await client.close()

    asyncio.run(check())


class SlowClient:
    """An aiokafka client stand-in whose metadata answer comes when the test releases it, as
    a TLS+SCRAM handshake on a loaded machine outlasts a probe's timeout."""

    def __init__(self, cluster_id: str) -> None:
        self.cluster_id = cluster_id
        self.release = asyncio.Event()
        self.requests = 0

    def get_random_node(self) -> int:
        return 1

    async def send(self, node: int, request: Any) -> Any:
        self.requests += 1
        await self.release.wait()
        return type("MetadataResponse", (), {"cluster_id": self.cluster_id})()


def test_a_slow_probe_names_no_broker_and_its_answer_still_counts() -> None:
    async def check() -> None:
        client = SlowClient("7Hn2uXQwT3yLb0aZ1c9rKg")  # a Kafka cluster's id
        named: list[str] = []
        watch = BrokerWatch(lambda: client, timeout_s=0.05, on_cluster=named.append)
        state = await watch.probe()
        assert not state.reachable and "within 0.05 s" in state.reason
        assert watch.cluster_id is None and named == []  # no answer: no broker named
        assert not (await watch.probe()).reachable
        assert client.requests == 1  # the same request waited on, not started again
        client.release.set()
        assert (await watch.probe()).reachable
        assert client.requests == 1
        assert watch.cluster_id == "7Hn2uXQwT3yLb0aZ1c9rKg"
        assert named == ["7Hn2uXQwT3yLb0aZ1c9rKg"]
        assert (await watch.probe()).reachable and client.requests == 2
        assert named == ["7Hn2uXQwT3yLb0aZ1c9rKg"]  # told once, not at every answer

    asyncio.run(check())


def test_no_client_yet_leaves_the_state_alone() -> None:
    async def check() -> None:
        watch = BrokerWatch(lambda: None)
        assert (await watch.probe()).reachable and watch.cluster_id is None
        # A stop before the app's producer connected: nothing to wait on the broker for.
        assert await watch.cut_off()

    asyncio.run(check())


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

    async def check() -> None:
        client = AIOKafkaClient(bootstrap_servers=bootstrap)
        named: list[str] = []
        watch = BrokerWatch(lambda: client, timeout_s=5.0, on_cluster=named.append)
        try:
            assert (await watch.probe()).reachable and not watch.lost_within(120.0)
            state = broker.status()
            assert state is not None
            os.kill(state.pid, signal.SIGKILL)
            assert trees.wait_gone([state.pid], 10.0)
            assert broker.start() == bootstrap  # the same address
            # The client's connection to the dead broker may fail once before it reconnects.
            for _ in range(3):
                if (await watch.probe()).reachable and len(named) == 2:
                    break
            assert watch.state.reachable
            assert watch.lost_within(120.0)
            assert len(named) == 2 and named[0] != named[1]
            assert all(name.startswith("mockCluster") for name in named)
        finally:
            await client.close()

    try:
        asyncio.run(check())
    finally:
        broker.stop()
