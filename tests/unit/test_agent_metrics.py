"""The agent's per-job metrics: the fold over a job's events (the demo's recorded job), the
decision round trip, a finished job's series dropped, one job's view, and the endpoint setting."""

from __future__ import annotations

import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from tailguard.agent.adapters import metrics as agent_metrics
from tailguard.agent.adapters.metrics import AgentMetrics, JobMetrics, MeteredPublisher
from tailguard.model import records as r
from tailguard.model.config import ConfigError, Settings
from tailguard.replay.inputs import read_archive

DEMO = Path(__file__).parent / "recorded" / "demo-speculation.avro"
RECORDS = [item for item in read_archive(DEMO, Settings())]
EVENTS = [i.record for i in RECORDS if i.topic == r.EVENTS_TOPIC]
COMMANDS = [i.record for i in RECORDS if i.topic == r.COMMANDS_TOPIC]
JOB = EVENTS[0].job_id
ROUND_TRIP_MS = 40


class Recording:
    """The publisher under the metered one: what reached it."""

    archive_path = "archive.avro"

    def __init__(self) -> None:
        self.published: list[r.Record] = []
        self.local_decisions: list[r.Record] = []
        self.closed = False

    def publish(self, record: r.Record) -> None:
        self.published.append(record)

    def local(self, record: r.Record) -> None:
        self.local_decisions.append(record)

    def close(self) -> None:
        self.closed = True


def samples(registry: Collector) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in registry.collect()
        for s in family.samples
    }


def total(values: dict, name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in values.items() if n == name and want <= ls)


def run_demo(metrics: AgentMetrics, job_id: str = JOB) -> tuple[JobMetrics, Recording]:
    job = JobMetrics(metrics, job_id, "sales-by-region")
    inner = Recording()
    publisher = MeteredPublisher(inner, job)
    for event in EVENTS:
        publisher.publish(event)
    for command in COMMANDS:
        job.command_received(command, now_ms=command.ts + ROUND_TRIP_MS)
    return job, inner


def test_the_demo_jobs_events_fold_into_its_metrics() -> None:
    metrics = AgentMetrics()
    _, inner = run_demo(metrics)
    assert inner.published == EVENTS  # passed through, in order
    values = samples(metrics.registry)

    deploying = [e for e in EVENTS if isinstance(e, r.AttemptDeploying)]
    finished = [e for e in EVENTS if isinstance(e, r.AttemptFinished)]
    speculative = {(e.vertex, e.subtask, e.attempt) for e in deploying if e.speculative}
    assert len(speculative) == 1  # the demo's copy of the straggler
    deployed = "tailguard_job_attempts_deployed_total"
    assert total(values, deployed, job_id=JOB) == len(deploying)
    assert total(values, deployed, speculative="true") == 1
    ended = "tailguard_job_attempts_ended_total"
    assert total(values, ended, outcome="finished") == len(finished)
    # The copy won, the straggler lost the race: Flink's "effective speculative execution".
    assert total(values, ended, outcome="finished", speculative="true") == 1
    assert total(values, ended, outcome="lost_race", speculative="false") == 1
    assert total(values, ended) == len(deploying)
    assert total(values, "tailguard_job_attempts_running") == 0

    for vertex in {e.vertex for e in finished}:
        mine = [e for e in finished if e.vertex == vertex]
        read = sum(e.input_bytes or 0 for e in mine)
        written = sum(sum(e.bytes_per_subpartition) for e in mine)
        assert total(values, "tailguard_job_input_bytes_total", vertex=vertex) == read
        assert total(values, "tailguard_job_output_bytes_total", vertex=vertex) == written

    slots = sum(e.slots for e in EVENTS if isinstance(e, r.NodeAdded))
    assert total(values, "tailguard_job_slots", job_id=JOB) == slots
    assert total(values, "tailguard_job_blocked_hosts", job_id=JOB) == 1  # blocked to the end
    applied = Counter(e.command_type for e in EVENTS if isinstance(e, r.CommandApplied))
    for kind, count in applied.items():
        assert total(values, "tailguard_job_commands_total", command=kind, result="applied") == (
            count
        )
    assert total(values, "tailguard_job_events_published_total", job_id=JOB) == len(EVENTS)
    trips = "tailguard_job_decision_round_trip_seconds"
    assert total(values, f"{trips}_count", job_id=JOB) == len(COMMANDS)
    assert total(values, f"{trips}_sum") == pytest.approx(len(COMMANDS) * ROUND_TRIP_MS / 1000)
    assert total(values, f"{trips}_bucket", le="0.025") == 0
    assert total(values, f"{trips}_bucket", le="0.05") == len(COMMANDS)
    start, end = EVENTS[0], EVENTS[-1]
    assert isinstance(end, r.JobFinished)
    assert total(values, "tailguard_job_start_time_seconds") == start.ts / 1000
    assert total(values, "tailguard_job_end_time_seconds", status="SUCCEEDED") == end.ts / 1000


def test_fallback_decisions_are_counted_by_command_type() -> None:
    metrics = AgentMetrics()
    job = JobMetrics(metrics, JOB, "sales-by-region")
    inner = Recording()
    publisher = MeteredPublisher(inner, job)
    publisher.local(COMMANDS[0])
    publisher.close()
    assert inner.local_decisions == [COMMANDS[0]] and inner.closed
    assert publisher.archive_path == "archive.avro"  # what the driver reports as the archive
    name = type(COMMANDS[0]).__name__
    values = samples(metrics.registry)
    assert total(values, "tailguard_job_fallback_decisions_total", command=name) == 1


def test_a_finished_job_leaves_nothing_behind_and_a_job_pushes_only_its_own() -> None:
    metrics = AgentMetrics()
    first, _ = run_demo(metrics, "job-1")
    second, _ = run_demo(metrics, "job-2")
    mine = samples(first.collector())
    assert mine and {dict(labels)["job_id"] for _, labels in mine} == {"job-1"}
    # The same families and types as the registry: what the Pushgateway receives is typed.
    kinds = {f.name: f.type for f in metrics.registry.collect()}
    assert {f.name: f.type for f in first.collector().collect()}.items() <= kinds.items()

    first.close()
    left = {dict(labels).get("job_id") for _, labels in samples(metrics.registry)}
    assert left == {"job-2"}
    second.close()
    assert samples(metrics.registry) == {}


@pytest.mark.parametrize(
    ("port", "problem"),
    [("metrics", "not a port number"), ("70000", "is not a port"), ("-1", "is not a port")],
)
def test_a_bad_port_setting_is_named(port: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=f"tailguard.metrics.port.*{problem}"):
        agent_metrics.serve_endpoint({"tailguard.metrics.port": port}, AgentMetrics())


def test_the_endpoint_is_off_unless_asked_for_and_serves_the_running_job() -> None:
    metrics = agent_metrics.process_metrics()
    assert agent_metrics.serve_endpoint({}, metrics) is None
    asked = {"tailguard.metrics.port": "0", "tailguard.metrics.host": "127.0.0.1"}
    url = agent_metrics.serve_endpoint(asked, metrics)
    assert url is not None and url.startswith("http://127.0.0.1:")
    # One endpoint per process: a later job reuses it.
    assert agent_metrics.serve_endpoint(asked, metrics) == url
    job, _ = run_demo(metrics, "job-served")
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            text = reply.read().decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        deployed = families["tailguard_job_attempts_deployed"]
        assert deployed.type == "counter"
        assert {s.labels["job_id"] for s in deployed.samples} >= {"job-served"}
    finally:
        job.close()


def test_a_pushgateway_url_is_logged_without_its_credentials() -> None:
    shown = agent_metrics._without_userinfo("https://user:s3cret@push.example:9091/base?x=1")
    assert shown == "https://push.example:9091/base"
    assert agent_metrics._without_userinfo("push:9091") == "http://push:9091"
