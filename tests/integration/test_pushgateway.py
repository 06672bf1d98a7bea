"""The agent pushes a job's metrics to a real Pushgateway (Debian's prometheus-pushgateway,
started on a free port): typed, grouped by job name, the next run replacing the previous one."""

from __future__ import annotations

import logging
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from tests.pushgateway import MISSING, free_port, running_pushgateway

from tailguard.agent.adapters import metrics as agent_metrics
from tailguard.agent.adapters.metrics import AgentMetrics, JobMetrics, MeteredPublisher
from tailguard.model import records as r
from tailguard.model.config import Settings
from tailguard.replay.inputs import read_archive

pytestmark = pytest.mark.skipif(bool(MISSING), reason=MISSING or "found")

DEMO = Path(__file__).parents[1] / "unit" / "recorded" / "demo-speculation.avro"
RECORDS = list(read_archive(DEMO, Settings()))
EVENTS = [i.record for i in RECORDS if i.topic == r.EVENTS_TOPIC]
COMMANDS = [i.record for i in RECORDS if i.topic == r.COMMANDS_TOPIC]


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[str]:
    with running_pushgateway(tmp_path) as url:
        yield url


def finished_job(metrics: AgentMetrics, job_id: str) -> JobMetrics:
    job = JobMetrics(metrics, job_id, "sales-by-region")
    publisher = MeteredPublisher(_Discard(), job)
    for event in EVENTS:
        publisher.publish(event)
    for command in COMMANDS:
        job.command_received(command, now_ms=command.ts + 30)
    return job


class _Discard:
    def publish(self, record: r.Record) -> None:
        pass

    def local(self, record: r.Record) -> None:
        pass

    def close(self) -> None:
        pass


def scrape(url: str) -> dict[str, Metric]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_a_job_end_pushes_its_series_and_the_next_run_replaces_them(gateway: str) -> None:
    metrics = AgentMetrics()
    settings = {agent_metrics.PUSHGATEWAY_KEY: gateway}
    first = finished_job(metrics, "sales-by-region-run-1")
    assert agent_metrics.push(settings, first)
    families = scrape(gateway)
    deployed = families["tailguard_job_attempts_deployed"]
    assert deployed.type == "counter"
    labels = deployed.samples[0].labels
    assert labels["job"] == agent_metrics.PUSH_JOB
    assert labels["job_name"] == "sales-by-region"
    assert labels["job_id"] == "sales-by-region-run-1"
    attempts = sum(s.value for s in deployed.samples)
    assert attempts == sum(isinstance(e, r.AttemptDeploying) for e in EVENTS)
    assert families["tailguard_job_decision_round_trip_seconds"].type == "histogram"
    assert families["tailguard_job_end_time_seconds"].samples[0].labels["status"] == "SUCCEEDED"

    second = finished_job(metrics, "sales-by-region-run-2")
    assert agent_metrics.push(settings, second)
    runs = {s.labels["job_id"] for s in scrape(gateway)["tailguard_job_attempts_deployed"].samples}
    assert runs == {"sales-by-region-run-2"}  # one group per job name, not one per run


def test_a_pushgateway_that_is_down_costs_the_job_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    job = finished_job(AgentMetrics(), "sales-by-region-unpushed")
    down = {agent_metrics.PUSHGATEWAY_KEY: f"http://user:pw-secret@127.0.0.1:{free_port()}"}
    with caplog.at_level(logging.WARNING, logger=agent_metrics.__name__):
        assert not agent_metrics.push(down, job)
    assert "not pushed" in caplog.text and "pw-secret" not in caplog.text
    assert not agent_metrics.push({}, job)  # none configured: nothing tried
