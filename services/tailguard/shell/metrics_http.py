"""A service's metrics (Prometheus) and health over HTTP.

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

import threading
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

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


class MetricsServer:
    def __init__(
        self,
        host: str,
        port: int,
        exposition: Callable[[], bytes],
        unhealthy: Callable[[], str | None],
    ) -> None:
        """`unhealthy()` is None when the service is healthy, else why not (one line)."""
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.startswith("/metrics"):
                    self._send(200, outer.exposition(), CONTENT_TYPE_LATEST)
                elif self.path.startswith("/health"):
                    reason = outer.unhealthy()
                    if reason is None:
                        self._send(200, b"ready\n")
                    else:
                        self._send(503, f"{reason}\n".encode())
                else:
                    self._send(404, b"not found\n")

            def _send(self, status: int, body: bytes, content_type: str = "text/plain") -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # scrapes every few seconds would drown the service's own log

        self.exposition = exposition
        self.unhealthy = unhealthy
        self._server = ThreadingHTTPServer((host, port), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
