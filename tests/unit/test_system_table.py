"""The table of the services (tailguard.system.services) is the one declaration: a sixth service
added as one entry plus its core runs behind the service shell and replays a recorded archive,
and the grants in model.authority agree with what the table says each service emits."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.unit.speculation_histories import SIMULATION_CONFIG

from tailguard.agent.driver.fallbacks import LocalFallbacks
from tailguard.codec import codec_for
from tailguard.model import records as r
from tailguard.model.authority import AGENT_STANDS_IN_FOR, FLEET_WRITERS, INPUT_WRITERS, PERMITTED
from tailguard.model.config import Settings
from tailguard.model.fleet import FleetBlock
from tailguard.model.ids import derived_id
from tailguard.replay.engine import Recorded, replay
from tailguard.replay.inputs import read_archive
from tailguard.shell.processor import Processor
from tailguard.system.services import (
    SERVICE_NAMES,
    SERVICES,
    Service,
    local_fallbacks,
    service_named,
)

ARCHIVE = Path(__file__).parent / "recorded" / "replay-v3-envelopes.avro"
SETTINGS = Settings(SIMULATION_CONFIG)


class FailFast:
    """The sixth service's core: a job fails at its first failed attempt. Pure, as every core."""

    def __init__(self, settings: Settings) -> None:
        self._failed: set[str] = set()

    def handle(self, record: r.Record) -> list[r.Record]:
        if not isinstance(record, r.AttemptFailed) or record.job_id in self._failed:
            return []
        self._failed.add(record.job_id)
        return [
            r.FailJob(
                job_id=record.job_id,
                ts=record.ts,
                id=derived_id("failfast", record.job_id),
                caused_by=(record.id,),
                reason=f"failfast: {record.vertex}[{record.subtask}] failed on {record.host}",
            )
        ]

    def metrics(self) -> dict[str, float]:
        return {}


SIXTH = Service("failfast", r.EVENTS_TOPIC, FailFast, outputs=(r.FailJob,))
SIX = (*SERVICES, SIXTH)


def live_outputs(service: Service, log: list[Recorded]) -> list[Recorded]:
    """What `service` publishes when it reads the log's input topic live: its core behind the
    shell's processor (what `tailguard services run` runs), each output decoded from its bytes,
    as the agent archives what it receives."""
    codec = codec_for(SETTINGS)
    processor = Processor(service, SETTINGS, codec)
    inputs = [x.record for x in log if x.topic == service.input_topic]
    out: list[Recorded] = []
    for offset, record in enumerate(inputs):
        for sent in processor.process(codec.encode(record), 0, offset):
            if sent.topic in (r.FINDINGS_TOPIC, r.COMMANDS_TOPIC) and sent.value is not None:
                out.append(Recorded(sent.topic, codec.decode(sent.value)))
    return out


def test_a_sixth_service_is_one_entry_and_replays_a_recorded_archive() -> None:
    recorded = list(read_archive(ARCHIVE, SETTINGS))
    before = replay(recorded, SETTINGS)
    assert before.differences == 0, [s.line() for s in before.services]
    # The service's settings announced to the job (model.policy_settings), then its decision:
    # the archive's job has failed attempts, and the first fails it.
    live = live_outputs(service_named("failfast", SIX), recorded)
    assert [type(x.record) for x in live] == [r.CommandSettings, r.FailJob], live

    report = replay([*recorded, *live], SETTINGS, services=SIX)

    assert report.differences == 0, [s.line() for s in report.services]
    by_name = {s.service: s for s in report.services}
    assert list(by_name) == [*SERVICE_NAMES, "failfast"]
    assert by_name["failfast"].reproduced == 2
    assert by_name["failfast"].line() == "failfast: 2 commands reproduced, 0 differences"
    # The five are replayed as they are without it.
    assert [s.line() for s in report.services[:5]] == [s.line() for s in before.services]


def test_a_sixth_service_whose_decision_is_not_in_the_log_is_a_difference() -> None:
    recorded = list(read_archive(ARCHIVE, SETTINGS))
    report = replay(recorded, SETTINGS, services=SIX)
    (failfast,) = [s for s in report.services if s.service == "failfast"]
    assert report.differences == len(failfast.differences) > 0
    described = [d.describe() for d in failfast.differences]
    assert any("replay emitted FailJob(failfast-" in d for d in described), described


def test_without_the_sixth_entry_its_commands_name_no_service() -> None:
    recorded = list(read_archive(ARCHIVE, SETTINGS))
    live = live_outputs(SIXTH, recorded)
    report = replay([*recorded, *live], SETTINGS)
    assert report.unattributed == [x.record for x in live]


def test_the_agent_stands_in_for_the_entries_marked_local_fallback() -> None:
    graph = r.JobGraphSpec(
        vertices=(
            r.VertexSpec("a", r.VertexKind.SOURCE, split_bytes=(10, 10)),  # adaptive
            r.VertexSpec("out", r.VertexKind.SINK),
        ),
        edges=(r.EdgeSpec("a", "out", r.Distribution.FORWARD),),
    )
    submitted = r.JobSubmitted(job_id="j", ts=1000, id="e1", name="j", graph=graph, config={})
    as_declared = LocalFallbacks(SETTINGS, services=False)
    as_declared.observe(submitted)
    assert [type(f.command) for f in as_declared.due(1000)] == [r.SetParallelism]
    # The same table with the decider no longer a fallback: the agent decides nothing.
    no_decider = tuple(
        Service(s.name, s.input_topic, s.core, s.outputs, s.retention, local_fallback=False)
        if s.name == "decider"
        else s
        for s in SERVICES
    )
    alone = LocalFallbacks(SETTINGS, services=False, table=no_decider)
    alone.observe(submitted)
    assert alone.due(1000) == []


def test_an_unknown_service_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown service 'nope'; the services are detector, "):
        service_named("nope")


def test_names_are_unique_and_each_reads_the_events_or_the_findings() -> None:
    assert len(set(SERVICE_NAMES)) == len(SERVICES)
    for s in SERVICES:
        assert s.input_topic in (r.EVENTS_TOPIC, r.FINDINGS_TOPIC), s.name
        assert s.outputs, s.name
    # A what-if replay chains the cores in the table's order: the findings' readers come after
    # every service that emits findings.
    order = {s.name: i for i, s in enumerate(SERVICES)}
    writers = [s for s in SERVICES if any(issubclass(t, r.Finding) for t in s.outputs)]
    readers = [s for s in SERVICES if s.input_topic == r.FINDINGS_TOPIC]
    assert max(order[w.name] for w in writers) < min(order[x.name] for x in readers)


def test_the_grants_agree_with_the_table() -> None:
    """What a service may sign is a grant of its own (model.authority, which the log layer and
    the signing checks read): declaring a service does not let it command jobs. The two agree."""
    commands = {
        s.name: {t for t in s.outputs if issubclass(t, r.Command)}
        for s in SERVICES
        if any(issubclass(t, r.Command) for t in s.outputs)
    }
    assert commands == {name: set(kinds) for name, kinds in PERMITTED.items()}
    assert {s.name for s in local_fallbacks()} == AGENT_STANDS_IN_FOR
    finding_writers = {s.name for s in SERVICES if any(issubclass(t, r.Finding) for t in s.outputs)}
    assert finding_writers == INPUT_WRITERS[r.FINDINGS_TOPIC]
    assert {s.name for s in SERVICES if FleetBlock in s.outputs} <= FLEET_WRITERS
