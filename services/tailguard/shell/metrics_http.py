"""A service's metrics (Prometheus) and health over HTTP, served by its faust app's own web
server (one HTTP server per service process).

GET /metrics   the process's registry in the Prometheus text format: the shell's own metrics
               (records processed and emitted, dead letters, rebuild, lag, readiness, decision
               latency) and the core's, under the names `tailguard.system.service_metrics`
               gives them
GET /health    200 "ready" once the service is consuming live and reaches its broker; 503 with
               the reason otherwise ("starting", "broker unreachable for 12 s: ...")

Every metric is listed, with its type, labels, unit and meaning, in docs/operations.md#metrics;
the acceptance test checks the list against what a running service exports.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import faust
from aiohttp.web import SockSite
from faust.web import Request, Response, View
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tailguard.system.core_metrics import EMITTED, PROCESSED, CoreMetric
from tailguard.system.services import Service

# The `_created` series prometheus_client adds to each counter and histogram in the text format
# are separate gauges there: noise for every dashboard, and twice the series.
disable_created_metrics()

# Decision latency spans a Tick-driven finding on an idle broker (milliseconds) to a service
# catching up after a restart (seconds to minutes).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def _base(name: str) -> str:
    """prometheus_client adds `_total` to a counter's name itself."""
    return name.removesuffix("_total")


class _CoreCollector(Collector):
    """The core's values, read at scrape time: the core keeps plain numbers (it is pure), so
    they are proxied as typed families, the way prometheus_client exports values held elsewhere.

    Counters count from the end of the rebuild (`mark_live`): what a restarted service re-reads
    to rebuild its state was counted by its previous incarnation, and counting it again would
    show as a burst in `rate()` after every restart.
    """

    def __init__(
        self,
        service: str,
        specs: tuple[CoreMetric, ...],
        values: Callable[[], Mapping[str, float]],
    ) -> None:
        self._service = service
        self._specs = tuple(s for s in specs if s.name is not None)
        self._values = values
        self._baseline: dict[str, float] = {}

    def mark_live(self) -> None:
        values = self._values()
        self._baseline = {s.key: values.get(s.key, 0.0) for s in self._specs if s.kind == "counter"}

    def collect(self) -> Iterator[Metric]:
        values = self._values()
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        for spec in self._specs:
            assert spec.name is not None
            value = float(values.get(spec.key, 0.0))
            family = families.get(spec.name)
            if family is None:
                kind = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
                family = families[spec.name] = kind(spec.name, spec.help, labels=["service"])
            family.add_metric([self._service], value - self._baseline.get(spec.key, 0.0))
        yield from families.values()


class ServiceMetrics:
    """One service process's metrics: its own CollectorRegistry, labelled `service`."""

    def __init__(self, definition: Service, core_values: Callable[[], Mapping[str, float]]) -> None:
        service = definition.name
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["service"]
        r = self.registry
        self.processed = Counter(
            _base(PROCESSED), "input records processed live", labels, registry=r
        ).labels(service)
        self._emitted = Counter(
            _base(EMITTED), "records published, by record type", [*labels, "record"], registry=r
        )
        self.dead_letters = Counter(
            "tailguard_service_dead_letters",
            "input records that did not decode, sent to <topic>.dlq",
            labels,
            registry=r,
        ).labels(service)
        self.refused = Counter(
            "tailguard_service_inputs_refused",
            "input records refused for their signature (signing on), sent to <topic>.dlq",
            labels,
            registry=r,
        ).labels(service)
        self.rebuilt = Counter(
            "tailguard_service_records_rebuilt",
            "input records re-read to rebuild the core's state, at start or on taking a "
            "partition over (outputs suppressed)",
            labels,
            registry=r,
        ).labels(service)
        self.lag = Gauge(
            "tailguard_service_consumer_lag_records",
            "records on the input partition after the last one processed",
            labels,
            registry=r,
        ).labels(service)
        self.ready = Gauge(
            "tailguard_service_ready",
            "1 once the service consumes live (what /health reports), 0 before",
            labels,
            registry=r,
        ).labels(service)
        self.partitions_owned = Gauge(
            "tailguard_service_partitions_owned",
            "partitions of the input topic this instance owns in its group (scale-out)",
            labels,
            registry=r,
        ).labels(service)
        self.decision_latency = Histogram(
            "tailguard_service_decision_latency_seconds",
            "from the input record's timestamp (the agent's clock) to the service's outputs "
            "for it acknowledged by the broker",
            labels,
            registry=r,
            buckets=LATENCY_BUCKETS,
        ).labels(service)
        self._service = service
        self._core = _CoreCollector(service, definition.metrics, core_values)
        self.registry.register(self._core)

    def emitted(self, record_type: str) -> None:
        self._emitted.labels(self._service, record_type).inc()

    def decision_sent(self, input_ts_ms: int, now_s: float) -> None:
        # Clocks of two hosts: a negative difference is skew, not time travel.
        self.decision_latency.observe(max(0.0, now_s - input_ts_ms / 1000.0))

    def mark_live(self) -> None:
        """The rebuild is over: the core's counters count from here."""
        self._core.mark_live()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on `host`:`port` (0 picks a free port), made before the app: the
    service announces its address at once, and a request that comes before faust's web server
    serves waits in the socket's backlog instead of being refused."""
    # Not inherited by the process a reconnect execs (worker.serve): new sockets never are.
    return socket.create_server((host, port), backlog=64)


def serve_on_app(
    app: faust.App,
    sock: socket.socket,
    exposition: Callable[[], bytes],
    unhealthy: Callable[[], str | None],
) -> None:
    """/metrics and /health as views of the faust app's own web server, on `sock`
    (`listening_socket`). `unhealthy()` is None when the service is healthy, else why not (one
    line). The app must have faust's web enabled on `sock`'s port (`web_options`)."""

    @app.page("/metrics")
    async def metrics(view: View, _request: Request) -> Response:
        # The Content-Type header as it is: aiohttp refuses a content_type with a charset.
        return view.bytes(exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    @app.page("/health")
    async def health(view: View, _request: Request) -> Response:
        reason = unhealthy()
        if reason is None:
            return view.bytes(b"ready\n", content_type="text/plain")
        return view.bytes(f"{reason}\n".encode(), content_type="text/plain", status=503)

    # The aiohttp driver's (faust.web.drivers.aiohttp.Web): faust types it as its base class.
    web: Any = app.web
    # faust's web server binds its own socket from web_bind and web_port, and its port setting
    # takes no 0; serving on the one already listening keeps the address announced.
    web._transport_handlers = {
        **web._transport_handlers,
        "tcp": lambda: SockSite(web._runner, sock),
    }


def web_options(sock: socket.socket) -> dict[str, Any]:
    """The `faust.App` settings of a web server serving only `serve_on_app`'s two views."""
    host, port = sock.getsockname()[:2]
    return {
        "web_enabled": True,
        "web_bind": host,
        "web_port": port,
        # Its own thread and loop, as the standalone server was: a scrape never waits on the
        # stream's loop, and /health answers while that loop is busy.
        "web_in_thread": True,
        # None of faust's own pages (its router, tables, statistics, graph).
        "web_router_enabled": False,
        "web_tables_enabled": False,
        "web_stats_enabled": False,
        "web_graph_enabled": False,
    }
