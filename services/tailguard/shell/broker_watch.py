"""Whether a service can reach its broker, for `/health` and `tailguard services status`.

faust's client (aiokafka) retries a lost broker by itself, forever, and reconnects when the
broker is back (at the same address; aio-libs/aiokafka#876 is what it looks like when it does not);
what it does not do is tell anyone that it is cut off: the stream simply stops. So a probe of
its own asks the broker for metadata every `interval_s`, from a thread (a blocked event loop must
not make the service look healthy or unhealthy), and remembers since when it has failed.

A stop asks it too (`cut_off`): faust's own shutdown waits on the broker (its commit, its
leave-group), so with the broker gone a service would sit out the supervisor's whole grace.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from confluent_kafka import KafkaException, Producer

from tailguard.kafka.config import client_config

log = logging.getLogger("tailguard.service")

# One metadata request per second: negligible for a broker, and /health turns within ~2 s.
PROBE_INTERVAL_S = 1.0
PROBE_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class BrokerState:
    reachable: bool
    since: float  # time.monotonic() of the last change
    reason: str = ""


class BrokerWatch:
    def __init__(
        self,
        settings: Mapping[str, str],
        interval_s: float = PROBE_INTERVAL_S,
        timeout_s: float = PROBE_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # librdkafka's own connection errors are this probe's business, said once per change
        # below; its log would repeat them at every reconnect attempt.
        config = client_config(settings, "producer", {"log_level": 0})
        self._client = Producer(config)
        self._interval = interval_s
        self._timeout = timeout_s
        self._clock = clock
        self._state = BrokerState(True, clock())
        # When the broker last came back after a loss, or answered as a new cluster (None:
        # never); the first state's `since` is the watch's start, not a return of the broker.
        self._back_at: float | None = None
        # The cluster id the broker last answered with.
        self._cluster_id: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="broker-watch", daemon=True)

    @property
    def state(self) -> BrokerState:
        return self._state

    @property
    def cluster_id(self) -> str | None:
        """The id the broker last answered with (None: it never answered)."""
        return self._cluster_id

    def probe(self, timeout_s: float | None = None) -> BrokerState:
        """Ask the broker now (at most `timeout_s`, default the watch's timeout)."""
        timeout = self._timeout if timeout_s is None else timeout_s
        try:
            metadata = self._client.list_topics(timeout=timeout)
        except KafkaException as err:
            self._changed(False, f"no broker answered within {timeout:g} s ({err})")
        else:
            self._changed(True, "")
            self._seen_cluster(metadata.cluster_id)
        return self._state

    def _seen_cluster(self, cluster_id: str | None) -> None:
        """A broker that answers under another cluster id is a new cluster, with a new log: an
        embedded broker restarted faster than one probe interval looks reachable throughout, so
        only its id tells it was lost (a real Kafka cluster keeps its id across restarts)."""
        if not cluster_id:
            return
        if self._cluster_id is not None and cluster_id != self._cluster_id:
            self._back_at = self._clock()
            log.error("broker replaced: cluster %s answers, not %s", cluster_id, self._cluster_id)
        self._cluster_id = cluster_id

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

    def start(self) -> None:
        """The first probe now, so the caller knows the broker (and its `cluster_id`) at once;
        then one every interval, in the watch's thread."""
        self.probe()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self._timeout + self._interval)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.probe()

    def lost_within(self, seconds: float) -> bool:
        """Whether the broker is unreachable now, or was, or was replaced by a new cluster,
        within the last `seconds`."""
        if not self._state.reachable:
            return True
        return self._back_at is not None and self._clock() - self._back_at <= seconds

    def cut_off(self, timeout_s: float | None = None) -> bool:
        """Whether the broker is unreachable: known already, or by a probe now (a broker killed
        less than a probe interval ago is not known yet)."""
        return not self._state.reachable or not self.probe(timeout_s).reachable

    def unhealthy_reason(self) -> str | None:
        state = self._state
        if state.reachable:
            return None
        return f"broker unreachable for {self._clock() - state.since:.0f} s: {state.reason}"
