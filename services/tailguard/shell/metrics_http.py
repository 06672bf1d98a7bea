"""Health and metrics of a service over HTTP, in the Prometheus text format.

GET /metrics   counters and gauges (FLIP-168's numSlowExecutionVertices and
               numEffectiveSpeculativeExecutions where the core has them, records processed,
               consumer lag)
GET /health    200 "ready" once the service is consuming live, 503 "starting" before
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

_NAME = re.compile(r"[^a-zA-Z0-9_]")


def metric_name(service: str, key: str) -> str:
    return f"tailguard_{service}_{_NAME.sub('_', key)}"


class _CoreCollector(Collector):
    """Reads the service's values at scrape time, so the core keeps plain counters."""

    def __init__(self, service: str, values: Callable[[], dict[str, float]]) -> None:
        self.service = service
        self.values = values

    def collect(self) -> Iterator[Metric]:
        for key, value in sorted(self.values().items()):
            family = GaugeMetricFamily(metric_name(self.service, key), f"{self.service} {key}")
            family.add_metric([], float(value))
            yield family


def render(service: str, values: Callable[[], dict[str, float]]) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_CoreCollector(service, values))
    return generate_latest(registry).decode()


class MetricsServer:
    def __init__(
        self,
        service: str,
        host: str,
        port: int,
        values: Callable[[], dict[str, float]],
        ready: Callable[[], bool],
    ) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.startswith("/metrics"):
                    self._send(200, render(service, outer.values), "text/plain; version=0.0.4")
                elif self.path.startswith("/health"):
                    ok = outer.ready()
                    self._send(200 if ok else 503, "ready\n" if ok else "starting\n", "text/plain")
                else:
                    self._send(404, "not found\n", "text/plain")

            def _send(self, status: int, body: str, content_type: str) -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                pass  # scrapes every few seconds would drown the service's own log

        self.values = values
        self.ready = ready
        self._server = ThreadingHTTPServer((host, port), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
