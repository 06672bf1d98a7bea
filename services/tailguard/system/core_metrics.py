"""How the values a service's core counts are exported (the list is in docs/operations.md).

The cores are pure: they keep plain numbers under their own keys (`metrics()`), and import no
metrics library. Each service's tuple in `service_metrics` says, per key, under which Prometheus
name and type the shell exports it. The same idea gets the same name whichever service counts it
(FLIP-168's slow vertices and effective speculative executions, jobs tracked, config errors); the
`service` label tells the reporters apart. A key whose value a shell metric already gives (a count
of emitted records) is listed with no name, so that every key is accounted for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class CoreMetric:
    key: str  # the key in the core's metrics()
    name: str | None  # None: not exported, a shell metric says it (see `same_as_emitted`)
    kind: Literal["counter", "gauge"]
    help: str


def counter(key: str, name: str, help: str) -> CoreMetric:
    if not name.endswith("_total"):
        raise ValueError(f"counter {name} must end in _total")
    return CoreMetric(key, name, "counter", help)


def gauge(key: str, name: str, help: str) -> CoreMetric:
    return CoreMetric(key, name, "gauge", help)


def same_as_emitted(key: str, record: str) -> CoreMetric:
    """A count of the core's own outputs: `records_emitted_total{record=...}` already says it."""
    return CoreMetric(key, None, "counter", f"{EMITTED}{{record={record!r}}}")


# The shell's own metrics, the same for every service (tailguard.shell.metrics_http).
PROCESSED = "tailguard_service_records_processed_total"
EMITTED = "tailguard_service_records_emitted_total"

# Ideas more than one core counts.


def jobs_tracked(key: str) -> CoreMetric:
    return gauge(
        key,
        "tailguard_service_jobs_tracked",
        "jobs whose state the core holds (dropped when the job finishes or, for the findings "
        "services, when the oldest is evicted)",
    )


def config_errors(key: str) -> CoreMetric:
    return counter(
        key,
        "tailguard_service_config_errors_total",
        "jobs whose recorded settings could not be read; they were decided with the service's "
        "own settings",
    )


def slow_execution_vertices(key: str) -> CoreMetric:
    return gauge(
        key,
        "tailguard_slow_execution_vertices",
        "vertices with a slow subtask now (FLIP-168 numSlowExecutionVertices)",
    )


def effective_speculative_executions(key: str) -> CoreMetric:
    return counter(
        key,
        "tailguard_effective_speculative_executions_total",
        "speculative attempts that finished first (FLIP-168 numEffectiveSpeculativeExecutions)",
    )
