"""The agent's per-job metrics (Prometheus): served while the job runs, pushed when it ends.

They are a fold over what the driver already tells its ports, so the driver counts nothing for
them: `MeteredPublisher` sits on the `Publisher` port and sees every event published (attempts,
nodes, blocks, bytes, commands applied and rejected) and every fallback decision; the command
consumer's `deliver` hands each command received to `JobMetrics.command_received` (the decision
round trip). What the metrics say is therefore what the archive says.

- Every series carries `job_id` (and `vertex`, the chain, where it is about attempts), and is
  removed from the process's registry when the job ends, after the push: a driver that runs job
  after job exports the running ones only. Vertex values are bounded by the job graph, every
  other label by a fixed set (outcomes, record types, job statuses).
- The endpoint (`tailguard.metrics.port`) is off by default: a driver opening a port nobody
  asked for on a shared gateway host is worse than a missing metric. `0` picks a free port (the
  address is logged and in `RunResult.extra["metrics_url"]`). One endpoint per process serves
  every job the process runs.
- `tailguard.metrics.pushgateway` (a URL) pushes the job's series at its end, grouped as
  `job="tailguard-agent", job_name=<the job's name>`: each run of a job replaces its previous
  run's group, so the Pushgateway holds one group per job name, not one per run.

Names, types, labels and units: docs/operations.md#metrics.
"""

from __future__ import annotations

import logging
import socket
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    push_to_gateway,
    start_http_server,
)
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from tailguard.agent.driver.ports import Publisher
from tailguard.model import records as r
from tailguard.model.config import ConfigError

log = logging.getLogger(__name__)

PORT_KEY = "tailguard.metrics.port"
HOST_KEY = "tailguard.metrics.host"
PUSHGATEWAY_KEY = "tailguard.metrics.pushgateway"
DEFAULT_HOST = "0.0.0.0"  # enabled means "scrape me": from the Prometheus host, not loopback
PUSH_JOB = "tailguard-agent"
PUSH_TIMEOUT_S = 10.0

# `outcome` of an attempt that was not cancelled (a cancelled one: lost_race or canceled).
OUTCOMES = {
    r.AttemptFinished: "finished",
    r.AttemptFailed: "failed",
}

# A decision comes back in milliseconds through an idle broker and in seconds when a service
# is catching up; past a minute the agent's own fallback has long decided.
ROUND_TRIP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

# The `_created` series are separate gauges in the text format: noise on every dashboard.
disable_created_metrics()


class AgentMetrics:
    """The driver process's metric objects, in one CollectorRegistry for the process."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        job, vertex = ["job_id"], ["job_id", "vertex"]
        reg = self.registry
        self.deployed = Counter(
            "tailguard_job_attempts_deployed",
            "attempts deployed to a slot, speculative copies apart",
            [*vertex, "speculative"],
            registry=reg,
        )
        self.ended = Counter(
            "tailguard_job_attempts_ended",
            "attempts that ended: finished (won), failed, lost_race or canceled",
            [*vertex, "speculative", "outcome"],
            registry=reg,
        )
        self.running = Gauge(
            "tailguard_job_attempts_running",
            "attempts deployed and not yet ended or cancelled",
            vertex,
            registry=reg,
        )
        self.input_bytes = Counter(
            "tailguard_job_input_bytes",
            "bytes read by the winning attempts",
            vertex,
            registry=reg,
            unit="bytes",
        )
        self.output_bytes = Counter(
            "tailguard_job_output_bytes",
            "bytes the winning attempts wrote to result partitions",
            vertex,
            registry=reg,
            unit="bytes",
        )
        self.slots = Gauge(
            "tailguard_job_slots", "slots of the hosts in the job's pool", job, registry=reg
        )
        self.blocked_hosts = Gauge(
            "tailguard_job_blocked_hosts", "hosts blocked now", job, registry=reg
        )
        self.commands = Counter(
            "tailguard_job_commands",
            "commands the agent applied or rejected, by command type",
            [*job, "command", "result"],
            registry=reg,
        )
        self.fallbacks = Counter(
            "tailguard_job_fallback_decisions",
            "decisions the agent took itself because the service did not answer in time",
            [*job, "command"],
            registry=reg,
        )
        self.round_trip = Histogram(
            "tailguard_job_decision_round_trip_seconds",
            "from the agent's event a command answers (the command's timestamp) to the "
            "command's arrival at the agent",
            [*job, "command"],
            registry=reg,
            buckets=ROUND_TRIP_BUCKETS,
        )
        self.events = Counter(
            "tailguard_job_events_published", "events the agent published", job, registry=reg
        )
        self.started = Gauge(
            "tailguard_job_start_time_seconds",
            "when the job was submitted (Unix time)",
            job,
            registry=reg,
        )
        self.finished = Gauge(
            "tailguard_job_end_time_seconds",
            "when the job finished (Unix time), by final status",
            [*job, "status"],
            registry=reg,
        )
        self._labelled: tuple[Counter | Gauge | Histogram, ...] = (
            self.deployed,
            self.ended,
            self.running,
            self.input_bytes,
            self.output_bytes,
            self.slots,
            self.blocked_hosts,
            self.commands,
            self.fallbacks,
            self.round_trip,
            self.events,
            self.started,
            self.finished,
        )

    def forget(self, job_id: str) -> None:
        """Drop every series of the job (it ended and was pushed)."""
        for metric in self._labelled:
            metric.remove_by_labels({"job_id": job_id})


_process: AgentMetrics | None = None
_process_lock = threading.Lock()


def process_metrics() -> AgentMetrics:
    global _process
    with _process_lock:
        if _process is None:
            _process = AgentMetrics()
        return _process


@dataclass
class _Live:
    vertex: str
    speculative: str


class JobMetrics:
    """One job's view of the process's metrics: the fold over its events."""

    def __init__(self, metrics: AgentMetrics, job_id: str, job_name: str) -> None:
        self.metrics = metrics
        self.job_id = job_id
        self.job_name = job_name
        self._live: dict[tuple[str, int, int], _Live] = {}
        self._host_slots: dict[str, int] = {}
        self._blocked: set[str] = set()
        self._on: Mapping[type, Callable[[Any], None]] = {
            r.JobSubmitted: self._submitted,
            r.NodeAdded: self._node_added,
            r.NodeRemoved: self._node_removed,
            r.NodeBlocked: self._blocked_host,
            r.NodeUnblocked: self._unblocked_host,
            r.AttemptDeploying: self._deploying,
            r.AttemptFinished: self._finished,
            r.AttemptFailed: self._ended,
            r.AttemptCanceled: self._ended,
            r.CommandApplied: self._applied,
            r.CommandRejected: self._rejected,
            r.JobFinished: self._job_finished,
        }

    # ------------------------------------------------------------------ what the ports see

    def observe(self, event: r.Record) -> None:
        """An event the driver published."""
        self.metrics.events.labels(self.job_id).inc()
        handler = self._on.get(type(event))
        if handler is not None:
            handler(event)

    def command_received(self, command: r.Command, now_ms: int) -> None:
        """A service's command arrived: the time since the event it answers (its timestamp is
        that event's, the services deciding in event time), on the agent's own clock."""
        seconds = max(0, now_ms - command.ts) / 1000.0
        self.metrics.round_trip.labels(self.job_id, type(command).__name__).observe(seconds)

    def fallback(self, command: r.Record) -> None:
        self.metrics.fallbacks.labels(self.job_id, type(command).__name__).inc()

    # ------------------------------------------------------------------ events

    def _submitted(self, event: r.JobSubmitted) -> None:
        m, job = self.metrics, self.job_id
        m.started.labels(job).set(event.ts / 1000.0)
        # Series that exist from the start, so a scrape shows 0 rather than nothing.
        m.slots.labels(job).set(0)
        m.blocked_hosts.labels(job).set(0)

    def _node_added(self, event: r.NodeAdded) -> None:
        self._host_slots[event.host] = event.slots
        self.metrics.slots.labels(self.job_id).set(sum(self._host_slots.values()))

    def _node_removed(self, event: r.NodeRemoved) -> None:
        self._host_slots.pop(event.host, None)
        self.metrics.slots.labels(self.job_id).set(sum(self._host_slots.values()))

    def _blocked_host(self, event: r.NodeBlocked) -> None:
        self._blocked.add(event.host)
        self.metrics.blocked_hosts.labels(self.job_id).set(len(self._blocked))

    def _unblocked_host(self, event: r.NodeUnblocked) -> None:
        self._blocked.discard(event.host)
        self.metrics.blocked_hosts.labels(self.job_id).set(len(self._blocked))

    def _deploying(self, event: r.AttemptDeploying) -> None:
        speculative = "true" if event.speculative else "false"
        self._live[(event.vertex, event.subtask, event.attempt)] = _Live(event.vertex, speculative)
        self.metrics.deployed.labels(self.job_id, event.vertex, speculative).inc()
        self.metrics.running.labels(self.job_id, event.vertex).inc()

    def _finished(self, event: r.AttemptFinished) -> None:
        self._ended(event)
        m, job = self.metrics, self.job_id
        if event.input_bytes is not None:
            m.input_bytes.labels(job, event.vertex).inc(event.input_bytes)
        m.output_bytes.labels(job, event.vertex).inc(sum(event.bytes_per_subpartition))

    def _ended(self, event: r.AttemptFinished | r.AttemptFailed | r.AttemptCanceled) -> None:
        # The first end of an attempt counts (a cancel is recorded when asked for; what the
        # runner reports after it adds no event).
        live = self._live.pop((event.vertex, event.subtask, event.attempt), None)
        if live is None:
            return
        if isinstance(event, r.AttemptCanceled):
            lost = event.reason is r.CancelReason.LOST_RACE
            outcome = "lost_race" if lost else "canceled"
        else:
            outcome = OUTCOMES[type(event)]
        self.metrics.running.labels(self.job_id, live.vertex).dec()
        self.metrics.ended.labels(self.job_id, live.vertex, live.speculative, outcome).inc()

    def _applied(self, event: r.CommandApplied) -> None:
        self.metrics.commands.labels(self.job_id, event.command_type, "applied").inc()

    def _rejected(self, event: r.CommandRejected) -> None:
        self.metrics.commands.labels(self.job_id, event.command_type, "rejected").inc()

    def _job_finished(self, event: r.JobFinished) -> None:
        self.metrics.finished.labels(self.job_id, event.status.value).set(event.ts / 1000.0)

    # ------------------------------------------------------------------ the end

    def collector(self) -> Collector:
        """This job's series only (what is pushed)."""
        return _OneJob(self.metrics.registry, self.job_id)

    def close(self) -> None:
        self.metrics.forget(self.job_id)


class _OneJob(Collector):
    def __init__(self, registry: CollectorRegistry, job_id: str) -> None:
        self._registry = registry
        self._job_id = job_id

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            samples = [s for s in family.samples if s.labels.get("job_id") == self._job_id]
            if samples:
                mine = Metric(family.name, family.documentation, family.type, family.unit)
                mine.samples = samples
                yield mine


class MeteredPublisher:
    """A `Publisher` that tells the job's metrics what passes through it."""

    def __init__(self, inner: Publisher, job: JobMetrics) -> None:
        self._inner = inner
        self._job = job
        # The driver reports where the archive is (RunResult.archive).
        self.archive_path: str | None = getattr(inner, "archive_path", None)

    def publish(self, record: r.Record) -> None:
        self._inner.publish(record)
        self._job.observe(record)

    def local(self, record: r.Record) -> None:
        self._inner.local(record)
        self._job.fallback(record)

    def close(self) -> None:
        self._inner.close()


# ---------------------------------------------------------------------- endpoint and push


class _Endpoint:
    def __init__(self, url: str, port: int, server: Any) -> None:
        self.url = url
        self.port = port
        self.server = server


_endpoint: _Endpoint | None = None


def serve_endpoint(settings: Mapping[str, str], metrics: AgentMetrics) -> str | None:
    """Start the process's endpoint if `tailguard.metrics.port` asks for one (once per process;
    later jobs reuse it); returns its URL, or None when off."""
    global _endpoint
    raw = (settings.get(PORT_KEY) or "").strip()
    if not raw:
        return None
    try:
        port = int(raw)
    except ValueError:
        raise ConfigError(f"{PORT_KEY}: not a port number: {raw!r}") from None
    if not 0 <= port <= 65535:
        raise ConfigError(f"{PORT_KEY}: {port} is not a port (0 picks a free one)")
    host = (settings.get(HOST_KEY) or DEFAULT_HOST).strip()
    with _process_lock:
        if _endpoint is not None:
            if port not in (0, _endpoint.port):
                log.warning(
                    "%s=%d ignored: this process already serves its metrics at %s",
                    PORT_KEY,
                    port,
                    _endpoint.url,
                )
            return _endpoint.url
        try:
            server, _thread = start_http_server(port, addr=host, registry=metrics.registry)
        except OSError as err:
            raise ConfigError(
                f"{PORT_KEY}/{HOST_KEY}: cannot serve metrics on {host}:{port}: {err}"
            ) from None
        bound = int(server.server_port)
        shown = socket.gethostname() if host in ("0.0.0.0", "::", "") else host
        _endpoint = _Endpoint(f"http://{shown}:{bound}/metrics", bound, server)
        return _endpoint.url


def push(settings: Mapping[str, str], job: JobMetrics) -> bool:
    """Push the job's series to the Pushgateway, if one is configured. A Pushgateway that is
    down costs the job nothing but a warning; returns whether a push was made."""
    gateway = (settings.get(PUSHGATEWAY_KEY) or "").strip()
    if not gateway:
        return False
    shown = _without_userinfo(gateway)
    try:
        push_to_gateway(
            gateway,
            job=PUSH_JOB,
            registry=job.collector(),
            grouping_key={"job_name": job.job_name},
            timeout=PUSH_TIMEOUT_S,
        )
    except (OSError, ValueError) as err:
        log.warning("job %s: metrics not pushed to %s: %s", job.job_id, shown, err)
        return False
    log.info("job %s: metrics pushed to %s", job.job_id, shown)
    return True


def _without_userinfo(url: str) -> str:
    """The URL as it may be logged: never a user or password in it."""
    parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))
