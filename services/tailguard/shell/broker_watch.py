"""Whether a service can reach its broker, for `/health` and `tailguard services status`, and
which broker it is (the consumer's fetch wait follows it: `kafka_config.fetch_wait`).

faust's client (aiokafka) retries a lost broker by itself, forever, and reconnects when the
broker is back (at the same address; aio-libs/aiokafka#876 is what it looks like when it does not);
what it does not do is tell anyone that it is cut off: the stream simply stops. So the watch asks
the broker for its metadata every `interval_s`, through the app's own aiokafka client (the
producer's: one Kafka client per service process), and remembers since when it has failed.

It runs on the app's event loop: a blocked loop delays the probe and leaves the state as it was,
instead of making the service look unhealthy. A probe that outlasts its timeout marks the broker
unreachable but is not cancelled: the next probe waits on the same request, so a connection whose
TLS and SASL handshake takes longer than the timeout under load still gets made (cancelling it
would start the handshake again every time). A slow probe never names the broker: only an answer
does (`cluster_id`), so a loaded machine's real Kafka is not taken for the mock broker.

A stop asks it too (`cut_off`): faust's own shutdown waits on the broker (its commit, its
leave-group), so with the broker gone a service would sit out the supervisor's whole grace.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiokafka.errors import KafkaError
from aiokafka.protocol.metadata import MetadataRequest

log = logging.getLogger("tailguard.service")

# One metadata request per second: negligible for a broker, and /health turns within ~2 s.
PROBE_INTERVAL_S = 1.0
PROBE_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class BrokerState:
    reachable: bool
    since: float  # time.monotonic() of the last change
    reason: str = ""


class NotConnected(ConnectionError):
    """The app's client does not exist yet (its producer has not started)."""


async def ask_cluster_id(client: Any) -> str | None:
    """The cluster id the broker behind aiokafka's `client` answers a metadata request with (no
    topics asked for: the smallest answer); raises what the client raises if none answers."""
    node = client.get_random_node()
    if node is None:
        await client.bootstrap()
        node = client.get_random_node()
        if node is None:
            raise NotConnected("the broker answered with no brokers")
    response = await client.send(node, MetadataRequest([]))
    return getattr(response, "cluster_id", None) or None


def _retrieved(task: asyncio.Task[str | None]) -> None:
    if not task.cancelled():
        task.exception()


class BrokerWatch:
    def __init__(
        self,
        client: Callable[[], Any],
        interval_s: float = PROBE_INTERVAL_S,
        timeout_s: float = PROBE_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        on_cluster: Callable[[str], None] | None = None,
    ) -> None:
        """`client()` is the aiokafka client to ask (AIOKafkaClient), or None while there is
        none yet; `on_cluster(cluster_id)` hears the first cluster id and every new one."""
        self._client = client
        self._interval = interval_s
        self._timeout = timeout_s
        self._clock = clock
        self._on_cluster = on_cluster
        self._state = BrokerState(True, clock())
        # When the broker last came back after a loss, or answered as a new cluster (None:
        # never); the first state's `since` is the watch's start, not a return of the broker.
        self._back_at: float | None = None
        # The cluster id the broker last answered with.
        self._cluster_id: str | None = None
        self._asking: asyncio.Task[str | None] | None = None

    @property
    def state(self) -> BrokerState:
        return self._state

    @property
    def cluster_id(self) -> str | None:
        """The id the broker last answered with (None: it never answered)."""
        return self._cluster_id

    async def probe(self, timeout_s: float | None = None) -> BrokerState:
        """Ask the broker now (at most `timeout_s`, default the watch's timeout). With no client
        yet, the state stays as it is."""
        timeout = self._timeout if timeout_s is None else timeout_s
        if self._asking is None or self._asking.done():
            client = self._client()
            if client is None:
                return self._state
            self._asking = asyncio.ensure_future(ask_cluster_id(client))
            # Its failure is read here when awaited; one that ends after every wait timed out
            # is read by this callback, not reported by asyncio as never retrieved.
            self._asking.add_done_callback(_retrieved)
        asking = self._asking
        try:
            cluster_id = await asyncio.wait_for(asyncio.shield(asking), timeout)
        except TimeoutError:
            self._changed(False, f"no broker answered within {timeout:g} s")
        except (KafkaError, OSError) as err:
            self._changed(False, f"no broker answered ({type(err).__name__}: {err})")
        else:
            self._changed(True, "")
            self._seen_cluster(cluster_id)
        return self._state

    def _seen_cluster(self, cluster_id: str | None) -> None:
        """A broker that answers under another cluster id is a new cluster, with a new log: an
        embedded broker restarted faster than one probe interval looks reachable throughout, so
        only its id tells it was lost (a real Kafka cluster keeps its id across restarts)."""
        if not cluster_id or cluster_id == self._cluster_id:
            return
        if self._cluster_id is not None:
            self._back_at = self._clock()
            log.error("broker replaced: cluster %s answers, not %s", cluster_id, self._cluster_id)
        self._cluster_id = cluster_id
        if self._on_cluster is not None:
            self._on_cluster(cluster_id)

    def _changed(self, reachable: bool, reason: str) -> None:
        before = self._state
        if before.reachable == reachable:
            return
        now = self._clock()
        self._state = BrokerState(reachable, now, reason)
        if reachable:
            self._back_at = now
            log.warning("broker reachable again after %.1f s", now - before.since)
        else:
            log.error("broker unreachable: %s", reason)

    async def run(
        self,
        stopping: Callable[[], bool],
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        """Probe now, then once every interval, until `stopping()` (`sleep` is the app's own,
        which ends early when the app stops: the loop must then end by itself, since a
        cancellation can be lost in the probe's wait_for on Python 3.11)."""
        while not stopping():
            await self.probe()
            await sleep(self._interval)

    def lost_within(self, seconds: float) -> bool:
        """Whether the broker is unreachable now, or was, or was replaced by a new cluster,
        within the last `seconds`."""
        if not self._state.reachable:
            return True
        return self._back_at is not None and self._clock() - self._back_at <= seconds

    async def cut_off(self, timeout_s: float | None = None) -> bool:
        """Whether the broker is unreachable: known already, or by a probe now (a broker killed
        less than a probe interval ago is not known yet). With no client yet, whether it has
        ever answered."""
        if not self._state.reachable:
            return True
        if self._client() is None:
            return self._cluster_id is None
        return not (await self.probe(timeout_s)).reachable

    def unhealthy_reason(self) -> str | None:
        state = self._state
        if state.reachable:
            return None
        return f"broker unreachable for {self._clock() - state.since:.0f} s: {state.reason}"
