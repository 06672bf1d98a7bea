"""docs/operations.md lists the metrics the code exports, checked fast: every service's
processor and the agent's metrics fed the demo's recorded job (the acceptance test does the same
with running services and a real job: tests/integration/test_metrics_documented.py)."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import generate_latest
from tests.documented_metrics import AGENT, documented, problems

from tailguard.agent.adapters.metrics import AgentMetrics, JobMetrics
from tailguard.codec import codec_for
from tailguard.model import records as r
from tailguard.model.config import Settings
from tailguard.replay.inputs import read_archive
from tailguard.shell.processor import Processor
from tailguard.system.services import SERVICE_NAMES, service_named

DEMO = Path(__file__).parent / "recorded" / "demo-speculation.avro"
SETTINGS = Settings()
CODEC = codec_for(SETTINGS)
RECORDS = list(read_archive(DEMO, SETTINGS))


def service_exposition(name: str) -> str:
    definition = service_named(name)
    processor = Processor(definition, SETTINGS, CODEC)
    for offset, item in enumerate(i for i in RECORDS if i.topic == definition.input_topic):
        processor.process(CODEC.encode(item.record), 0, offset)
    processor.metrics.decision_sent(RECORDS[0].record.ts, RECORDS[0].record.ts / 1000 + 0.1)
    return processor.metrics.exposition().decode()


def agent_exposition() -> str:
    metrics = AgentMetrics()
    job = JobMetrics(metrics, RECORDS[0].record.job_id, "demo")
    for item in RECORDS:
        if item.topic == r.EVENTS_TOPIC:
            job.observe(item.record)
        elif isinstance(item.record, r.Command):
            job.command_received(item.record, item.record.ts + 20)
            job.fallback(item.record)
    return generate_latest(metrics.registry).decode()


def test_the_code_exports_what_the_docs_list_both_ways() -> None:
    scrapes = {name: service_exposition(name) for name in SERVICE_NAMES}
    scrapes[AGENT] = agent_exposition()
    assert problems(scrapes) == []


def test_the_comparison_finds_a_missing_and_an_unlisted_metric() -> None:
    """The check can fail: a metric renamed in the code shows up twice."""
    text = service_exposition("decider").replace(
        "tailguard_decider_vertices_decided", "tailguard_decider_vertices_chosen"
    )
    found = problems({"decider": text})
    assert any("tailguard_decider_vertices_chosen" in p and "not listed" in p for p in found)
    assert any(p.startswith("tailguard_decider_vertices_decided_total:") for p in found)


def test_the_docs_follow_the_naming_conventions() -> None:
    for doc in documented().values():
        assert doc.name.endswith("_total") == (doc.type == "counter"), doc.name
        if doc.unit.startswith("seconds"):
            assert doc.name.endswith("_seconds"), doc.name
        if doc.unit == "bytes":
            assert doc.name.endswith("_bytes_total") or doc.name.endswith("_bytes"), doc.name
        assert doc.exporters and doc.type in ("counter", "gauge", "histogram"), doc.name
