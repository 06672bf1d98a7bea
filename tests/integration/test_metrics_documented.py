"""Acceptance (issue 12): the five services on the embedded broker and the agent during a real
job export exactly the metrics docs/operations.md lists, with their types and labels; the job's
series are pushed to a Pushgateway at its end and leave the driver's endpoint; the agent's and
the services' JSON log lines name the job and the records."""

from __future__ import annotations

import io
import json
import logging
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tests.documented_metrics import AGENT, problems
from tests.pushgateway import MISSING, running_pushgateway
from tests.spark_marks import SPARK

from tailguard import logs, stack
from tailguard.agent.adapters import metrics as agent_metrics
from tailguard.agent.driver.hooks import JobHooks
from tailguard.examples import sales_by_region
from tailguard.model import records as r
from tailguard.model.config import Settings
from tailguard.shell import supervisor

pytestmark = [*SPARK, pytest.mark.slow]


def quiet(_message: str) -> None:
    pass


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return str(reply.read().decode())


def json_lines(text: str) -> list[dict[str, Any]]:
    # Lines that are not JSON are librdkafka's own, written to stderr by the C library.
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


@pytest.mark.skipif(bool(MISSING), reason=MISSING or "found")
def test_services_and_a_running_job_export_what_the_docs_list(
    tailguard_local_spark: Any, tmp_path: Path
) -> None:
    """The broker and the services are this test's own (its work dir, JSON logs); Spark is
    the pytest plugin's local[2] session."""
    from tailguard.agent.entry import run

    work = tmp_path / "work"
    work.mkdir()
    data = sales_by_region.generate(tmp_path / "data", files=2, rows_per_file=2_000)
    agent_log = io.StringIO()
    levels = [(lg, lg.level) for lg in (logging.getLogger(), logging.getLogger("tailguard"))]
    handler = logs.configure("json", stream=agent_log)
    scraped: dict[str, str] = {}

    def scrape_the_agent_mid_job(event: r.Event) -> None:
        # After the first attempt finished, while others run: the driver's own endpoint.
        if isinstance(event, r.AttemptFinished) and AGENT not in scraped:
            scraped[AGENT] = get(endpoint)

    with ExitStack() as stop:
        stop.callback(logging.getLogger().removeHandler, handler)
        for logger, level in levels:
            stop.callback(logger.setLevel, level)
        stop.enter_context(stack.broker(work))
        services = supervisor.start(work, report=quiet, log_format="json")
        stop.callback(supervisor.stop, work, report=quiet)
        gateway = stop.enter_context(running_pushgateway(tmp_path))
        settings = Settings(
            {
                "tailguard.work-dir": str(work),
                "tailguard.archive-dir": str(work / "archive"),
                "execution.batch.adaptive.auto-parallelism.avg-data-volume-per-task": "64 KiB",
                agent_metrics.PORT_KEY: "0",
                agent_metrics.HOST_KEY: "127.0.0.1",
                agent_metrics.PUSHGATEWAY_KEY: gateway,
            }
        )
        # The process's endpoint, which the job serves on (one per driver process).
        endpoint = agent_metrics.serve_endpoint(settings, agent_metrics.process_metrics())
        assert endpoint is not None
        result = run(
            sales_by_region.make_job(data, tmp_path / "out"),
            tailguard_local_spark,
            settings=settings,
            progress=False,
            hooks=JobHooks(on_event=scrape_the_agent_mid_job),
        )
        assert result.ok, result.summary()
        assert result.extra["metrics_url"] == endpoint
        for name, service in services.items():
            scraped[name] = get(f"{service.metrics_url}/metrics")
        pushed = get(f"{gateway}/metrics")
        after = get(endpoint)
    service_logs = {n: (work / "services" / f"{n}.log").read_text() for n in services}

    # The acceptance check: names, types, labels and exporters against the docs, both ways.
    assert set(scraped) == {AGENT, *supervisor.SERVICE_NAMES}
    assert problems(scraped) == []

    # What the agent exported mid-job was this job, with attempts under way or done.
    families = {f.name: f for f in text_string_to_metric_families(scraped[AGENT])}
    deployed = families["tailguard_job_attempts_deployed"].samples
    assert {s.labels["job_id"] for s in deployed} == {result.job_id}
    assert sum(s.value for s in deployed) >= 1
    # The services answered live: decision latency measured from the agent's own timestamps.
    decider = {f.name: f for f in text_string_to_metric_families(scraped["decider"])}
    latency = decider["tailguard_service_decision_latency_seconds"].samples
    count = next(s.value for s in latency if s.name.endswith("_count"))
    total = next(s.value for s in latency if s.name.endswith("_sum"))
    assert count >= 1 and 0 <= total / count < 60

    # Pushed at its end, grouped by job name; gone from the driver's endpoint.
    pushed_families = {f.name: f for f in text_string_to_metric_families(pushed)}
    ended = pushed_families["tailguard_job_end_time_seconds"].samples
    assert [(s.labels["job_id"], s.labels["status"], s.labels["job_name"]) for s in ended] == [
        (result.job_id, "SUCCEEDED", "sales-by-region")
    ]
    assert result.job_id not in after

    # JSON logs: the agent's lines during the job name it; the services' decisions name the job,
    # the decision and its causes.
    agent_lines = [
        line
        for line in json_lines(agent_log.getvalue())
        if line["logger"].startswith("tailguard.agent")
    ]
    assert agent_lines, agent_log.getvalue()[-2000:]
    assert all(line.get("job_id") == result.job_id for line in agent_lines), agent_lines
    decisions = [
        line for line in json_lines(service_logs["decider"]) if line.get("job_id") == result.job_id
    ]
    assert decisions, service_logs["decider"][-2000:]
    for line in decisions:
        assert line["service"] == "decider" and line["level"] == "INFO"
        assert line["record_id"].startswith("decider-") and line["caused_by"]
