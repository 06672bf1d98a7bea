"""The services' metrics: every core value accounted for under a conventional name, and what a
processor fed the demo's recorded job exports (names, types, values, the rebuild baseline)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tailguard.codec import codec_for
from tailguard.model import records as r
from tailguard.model.config import Settings
from tailguard.replay.inputs import read_archive
from tailguard.shell.processor import Processor
from tailguard.system.services import SERVICE_NAMES, service_named

DEMO = Path(__file__).parent / "recorded" / "demo-speculation.avro"
SETTINGS = Settings()
CODEC = codec_for(SETTINGS)
SNAKE = re.compile(r"tailguard_[a-z0-9]+(_[a-z0-9]+)*")


def demo_inputs(topic: str) -> Iterator[r.Record]:
    for item in read_archive(DEMO, SETTINGS):
        if item.topic == topic:
            yield item.record


def samples(processor: Processor) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(processor.metrics.exposition().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def types(processor: Processor) -> dict[str, str]:
    text = processor.metrics.exposition().decode()
    return {f.name: f.type for f in text_string_to_metric_families(text)}


@pytest.mark.parametrize("name", SERVICE_NAMES)
def test_every_core_value_is_exported_or_said_by_a_shell_metric(name: str) -> None:
    definition = service_named(name)
    keys = set(definition.core(SETTINGS).metrics())
    listed = [m.key for m in definition.metrics]
    assert sorted(listed) == sorted(keys), "each core key listed once in its service.py"
    for metric in definition.metrics:
        if metric.name is None:
            continue
        assert SNAKE.fullmatch(metric.name), metric.name
        assert metric.name.endswith("_total") == (metric.kind == "counter"), metric.name
        assert metric.help


def test_one_name_means_one_thing_across_services() -> None:
    seen: dict[str, tuple[str, str]] = {}
    for name in SERVICE_NAMES:
        for metric in service_named(name).metrics:
            if metric.name is None:
                continue
            meaning = (metric.kind, metric.help)
            assert seen.setdefault(metric.name, meaning) == meaning, metric.name
    # The ideas two services count (FLIP-168's), under one name each.
    flip168 = {
        "tailguard_slow_execution_vertices",
        "tailguard_effective_speculative_executions_total",
    }
    assert flip168 <= set(seen)
    for name in ("detector", "speculator"):
        assert flip168 <= {m.name for m in service_named(name).metrics}


def test_the_detector_fed_the_demo_job_exports_typed_metrics() -> None:
    processor = Processor(service_named("detector"), SETTINGS, CODEC)
    events = list(demo_inputs(r.EVENTS_TOPIC))
    emitted: dict[str, int] = {}
    for offset, event in enumerate(events):
        for out in processor.process(CODEC.encode(event), 0, offset):
            kind = type(CODEC.decode(out.value)).__name__
            emitted[kind] = emitted.get(kind, 0) + 1
            assert out.input_ts == event.ts  # what the decision latency is measured from
    processor.process(b"\x00not avro", 0, len(events))

    values = samples(processor)
    detector = (("service", "detector"),)
    assert values[("tailguard_service_records_processed_total", detector)] == len(events) + 1
    assert values[("tailguard_service_dead_letters_total", detector)] == 1
    assert emitted["SlowTasksDetected"] >= 1 and emitted["SpeculativeAttemptWon"] == 1
    for kind, count in emitted.items():
        labels = (("record", kind), ("service", "detector"))
        assert values[("tailguard_service_records_emitted_total", labels)] == count
    # The demo's speculative copy won: the detector saw it.
    assert values[("tailguard_effective_speculative_executions_total", detector)] == 1
    assert values[("tailguard_detector_attempts_examined_total", detector)] > 0
    # The job finished: the detector dropped it.
    assert values[("tailguard_service_jobs_tracked", detector)] == 0

    kinds = types(processor)
    assert kinds["tailguard_service_records_processed"] == "counter"
    assert kinds["tailguard_effective_speculative_executions"] == "counter"
    assert kinds["tailguard_slow_execution_vertices"] == "gauge"
    assert kinds["tailguard_service_decision_latency_seconds"] == "histogram"
    assert all(SNAKE.fullmatch(n) for n in kinds), kinds


def test_the_speculator_reports_flip168_metrics_under_the_detectors_names() -> None:
    processor = Processor(service_named("speculator"), SETTINGS, CODEC)
    for offset, finding in enumerate(demo_inputs(r.FINDINGS_TOPIC)):
        processor.process(CODEC.encode(finding), 0, offset)
    values = samples(processor)
    speculator = (("service", "speculator"),)
    assert values[("tailguard_effective_speculative_executions_total", speculator)] == 1
    launched = values[
        (
            "tailguard_service_records_emitted_total",
            (("record", "LaunchSpeculativeAttempts"), ("service", "speculator")),
        )
    ]
    assert launched >= 1
    assert values[("tailguard_speculator_attempts_requested_total", speculator)] >= launched


def test_core_counters_count_from_the_end_of_the_rebuild() -> None:
    """What a restarted service re-reads was counted by its previous incarnation."""
    events = [CODEC.encode(e) for e in demo_inputs(r.EVENTS_TOPIC)]
    processor = Processor(service_named("detector"), SETTINGS, CODEC)
    for offset, raw in enumerate(events):
        processor.replay(raw, 0, offset)
    before = samples(processor)
    examined = ("tailguard_detector_attempts_examined_total", (("service", "detector"),))
    assert before[examined] > 0  # counted while rebuilding...
    processor.metrics.mark_live()
    after = samples(processor)
    assert after[examined] == 0  # ...but not once live
    rebuilt = ("tailguard_service_records_rebuilt_total", (("service", "detector"),))
    assert after[rebuilt] == len(events)


def test_decision_latency_is_observed_from_the_input_timestamp() -> None:
    processor = Processor(service_named("decider"), SETTINGS, CODEC)
    processor.metrics.decision_sent(input_ts_ms=10_000, now_s=10.25)
    processor.metrics.decision_sent(input_ts_ms=20_000, now_s=19.0)  # skewed clocks: 0
    values = samples(processor)
    decider = (("service", "decider"),)
    assert values[("tailguard_service_decision_latency_seconds_count", decider)] == 2
    assert values[("tailguard_service_decision_latency_seconds_sum", decider)] == 0.25
    bucket = (("le", "0.25"), ("service", "decider"))
    assert values[("tailguard_service_decision_latency_seconds_bucket", bucket)] == 2
