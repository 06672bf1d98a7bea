"""Round trips through both codecs, and the errors a consumer sees for bad messages."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.examples_budget import examples
from tests.strategies import record_of, records

from tailguard.codec import (
    ConfluentCodec,
    DecodeError,
    RecordCodec,
    SingleObjectCodec,
    codec_for,
    from_avro,
    load_schemas,
    registry_client,
    to_avro,
)
from tailguard.codec.schemas import current_schemas, released_schemas
from tailguard.codec.single_object import MARKER
from tailguard.model import records as r
from tailguard.model.config import Settings

_mock_urls = (f"mock://test-codec-{n}" for n in itertools.count())


def _confluent() -> ConfluentCodec:
    return ConfluentCodec(registry_client({"schema-registry.url": next(_mock_urls)}))


@pytest.fixture(params=["single-object", "confluent"])
def codec(request: pytest.FixtureRequest) -> Iterator[RecordCodec]:
    yield SingleObjectCodec() if request.param == "single-object" else _confluent()


JOB = "job-42"
CHAIN = "join→enrich"
GRAPH = r.JobGraphSpec(
    vertices=(
        r.VertexSpec("orders", r.VertexKind.SOURCE, split_bytes=(64 << 20, 64 << 20, 12 << 20)),
        r.VertexSpec("regions", r.VertexKind.SOURCE, parallelism=1, split_bytes=(4096,)),
        # A chain of two operators, named by them; a pipelined edge and another parallelism break
        # the chain before the sink.
        r.VertexSpec(
            CHAIN, r.VertexKind.OPERATOR, max_parallelism=128, operators=("join", "enrich")
        ),
        r.VertexSpec("sink", r.VertexKind.SINK, parallelism=1, speculation_safe=True),
    ),
    edges=(
        r.EdgeSpec("orders", CHAIN, r.Distribution.ALL_TO_ALL),
        r.EdgeSpec("regions", CHAIN, r.Distribution.BROADCAST, index=1),
        r.EdgeSpec(CHAIN, "sink", r.Distribution.FORWARD, r.Exchange.PIPELINED),
    ),
)
RANGES = (
    r.SubtaskInputs(0, (r.InputRange("orders", 0, 2, 0, 63), r.InputRange("regions", 0, 0, 0, 0))),
    r.SubtaskInputs(
        1, (r.InputRange("orders", 0, 2, 64, 127), r.InputRange("regions", 0, 0, 0, 0))
    ),
)
SLOW = r.SlowSubtask(
    subtask=3,
    live_attempts=(
        r.SlowAttempt(0, "127.0.0.3", 95_000, input_bytes=64 << 20),
        r.SlowAttempt(1, "127.0.0.2", 1_200, input_bytes=64 << 20, speculative=True),
    ),
    latest_attempt=1,
)
EXAMPLES: dict[type[r.Record], r.Record] = {
    r.JobSubmitted: r.JobSubmitted(
        job_id=JOB,
        ts=1_763_900_000_000,
        id=f"{JOB}-e0",
        name="orders by region",
        graph=GRAPH,
        config={"execution.batch.speculative.enabled": "true", "decider.timeout": "10 s"},
    ),
    r.NodeAdded: r.NodeAdded(
        job_id=JOB, ts=1_763_900_000_010, id=f"{JOB}-e1", host="127.0.0.2", slots=2
    ),
    r.NodeRemoved: r.NodeRemoved(
        job_id=JOB, ts=1_763_900_090_000, id=f"{JOB}-e90", host="127.0.0.4", reason="worker lost"
    ),
    r.NodeBlocked: r.NodeBlocked(
        job_id=JOB,
        ts=1_763_900_030_000,
        id=f"{JOB}-e40",
        host="127.0.0.3",
        until_ts=1_763_900_090_000,
        cause="slow attempts of join",
        command_id="blocklist-ab12",
    ),
    r.NodeUnblocked: r.NodeUnblocked(
        job_id=JOB, ts=1_763_900_090_000, id=f"{JOB}-e91", host="127.0.0.3"
    ),
    r.VertexInitialized: r.VertexInitialized(
        job_id=JOB,
        ts=1_763_900_020_000,
        id=f"{JOB}-e30",
        vertex=CHAIN,
        parallelism=2,
        subtask_inputs=RANGES,
        decided_by="decider",
        command_id="decider-77aa",
    ),
    r.AttemptDeploying: r.AttemptDeploying(
        job_id=JOB,
        ts=1_763_900_020_100,
        id=f"{JOB}-e31",
        vertex=CHAIN,
        subtask=1,
        attempt=1,
        host="127.0.0.2",
        speculative=True,
        command_id="speculator-0c1d",
    ),
    r.AttemptFinished: r.AttemptFinished(
        job_id=JOB,
        ts=1_763_900_025_000,
        id=f"{JOB}-e35",
        vertex="orders",
        subtask=2,
        attempt=0,
        host="127.0.0.2",
        input_bytes=12 << 20,
        records=180_000,
        bytes_per_subpartition=tuple(1_000 + 37 * i for i in range(128)),
        checksums=tuple(f"{i * 2_654_435_761 % 2**64:016x}" for i in range(128)),
    ),
    r.AttemptFailed: r.AttemptFailed(
        job_id=JOB,
        ts=1_763_900_026_000,
        id=f"{JOB}-e36",
        vertex=CHAIN,
        subtask=0,
        attempt=0,
        host="127.0.0.4",
        error=r.ErrorKind.PARTITION_MISSING,
        message="orders/1#0 is gone",
        missing_partition=r.PartitionRef("orders", 1, 0),
    ),
    r.AttemptCanceled: r.AttemptCanceled(
        job_id=JOB,
        ts=1_763_900_027_000,
        id=f"{JOB}-e37",
        vertex=CHAIN,
        subtask=1,
        attempt=0,
        host="127.0.0.3",
        reason=r.CancelReason.LOST_RACE,
    ),
    r.AttemptProgress: r.AttemptProgress(
        job_id=JOB,
        ts=1_763_900_026_500,
        id=f"{JOB}-e38",
        vertex=CHAIN,
        subtask=1,
        attempt=0,
        host="127.0.0.3",
        records_read=41_250,
        bytes_read=9 << 20,
        bytes_total=64 << 20,
    ),
    r.PartitionReleased: r.PartitionReleased(
        job_id=JOB, ts=1_763_900_100_000, id=f"{JOB}-e99", partition=r.PartitionRef("orders", 0, 0)
    ),
    r.Tick: r.Tick(job_id=JOB, ts=1_763_900_021_000, id=f"{JOB}-e32"),
    r.CommandApplied: r.CommandApplied(
        job_id=JOB,
        ts=1_763_900_030_001,
        id=f"{JOB}-e41",
        command_id="blocklist-ab12",
        command_type="BlockNodes",
    ),
    r.CommandRejected: r.CommandRejected(
        job_id=JOB,
        ts=1_763_900_030_002,
        id=f"{JOB}-e42",
        command_id="decider-dead",
        command_type="SetParallelism",
        reason="vertex join already initialized",
    ),
    r.JobFinished: r.JobFinished(
        job_id=JOB, ts=1_763_900_200_000, id=f"{JOB}-e120", status=r.JobStatus.SUCCEEDED
    ),
    r.JobRecovered: r.JobRecovered(
        job_id=JOB,
        ts=1_763_900_150_000,
        id=f"{JOB}-e58",
        replaced_run=f"{JOB}-e1",
        last_sequence=57,
        last_event_ts=1_763_900_090_000,
        log_source="the archive and the events topic (2 events not archived)",
        reset_attempts=(r.AttemptRef(CHAIN, 1, 0), r.AttemptRef(CHAIN, 3, 1)),
        kept_results=(r.PartitionRef(CHAIN, 0, 0), r.PartitionRef(CHAIN, 2, 0)),
        kept_sink_parts=(r.TaskRef("join→sink", 0),),
        lost_results=(
            r.LostResult(r.PartitionRef(CHAIN, 4, 0), r.ResultLoss.CHECKSUM_MISMATCH, True),
            r.LostResult(r.PartitionRef(CHAIN, 5, 2), r.ResultLoss.MISSING, False),
        ),
        commands_handled=6,
    ),
    r.SlowTasksDetected: r.SlowTasksDetected(
        job_id=JOB,
        ts=1_763_900_029_000,
        id="detector-5e5e",
        caused_by=(f"{JOB}-e38",),
        vertex=CHAIN,
        speculation_safe=True,
        baseline_ms=60_000,
        baseline_ns_per_byte=1.4901161,
        slow=(SLOW,),
        hosts=("127.0.0.2", "127.0.0.3", "127.0.0.4"),
    ),
    r.SpeculativeAttemptWon: r.SpeculativeAttemptWon(
        job_id=JOB,
        ts=1_763_900_031_000,
        id="detector-9a9a",
        caused_by=(f"{JOB}-e45",),
        vertex=CHAIN,
        subtask=3,
        attempt=1,
        host="127.0.0.2",
    ),
    r.LaunchSpeculativeAttempts: r.LaunchSpeculativeAttempts(
        job_id=JOB,
        ts=1_763_900_029_000,
        id="speculator-0c1d",
        caused_by=("detector-5e5e",),
        vertex=CHAIN,
        subtask=3,
        count=1,
        avoid_hosts=("127.0.0.3",),
    ),
    r.BlockNodes: r.BlockNodes(
        job_id=JOB,
        ts=1_763_900_029_000,
        id="blocklist-ab12",
        caused_by=("detector-5e5e",),
        hosts=("127.0.0.3",),
        until_ts=1_763_900_089_000,
        cause="slow attempts of join",
    ),
    r.UnblockNodes: r.UnblockNodes(
        job_id=JOB,
        ts=1_763_900_089_000,
        id="blocklist-cd34",
        caused_by=(f"{JOB}-e88",),
        hosts=("127.0.0.3",),
    ),
    r.SetParallelism: r.SetParallelism(
        job_id=JOB,
        ts=1_763_900_020_000,
        id="decider-77aa",
        caused_by=(f"{JOB}-e28", f"{JOB}-e29"),
        vertex=CHAIN,
        parallelism=2,
        subtask_inputs=RANGES,
    ),
    r.RestartTasks: r.RestartTasks(
        job_id=JOB,
        ts=1_763_900_026_000,
        id="failover-1f1f",
        caused_by=(f"{JOB}-e36",),
        tasks=(r.TaskRef("orders", 1), r.TaskRef(CHAIN, 0)),
        reason="partition orders/1 missing",
        not_before_ts=1_763_900_027_000,
    ),
    r.FailJob: r.FailJob(
        job_id=JOB,
        ts=1_763_900_150_000,
        id="failover-ffff",
        caused_by=(f"{JOB}-e110",),
        reason="restart limit reached: 4 failures of join/0",
    ),
}

# The services' policy settings: the detector's, and a command writer's, answering it.
EXAMPLES[r.FindingSettings] = r.FindingSettings(
    job_id=JOB,
    ts=1_763_900_000_000,
    id="detector-5e77",
    caused_by=(f"{JOB}-e0",),
    service="detector",
    version="0123456789abcdef",
    settings={"slow-task-detector.execution-time.baseline-multiplier": "2"},
    explicit=("slow-task-detector.execution-time.baseline-multiplier",),
    job_settings={"execution.batch.speculative.max-concurrent-executions": "3"},
)
EXAMPLES[r.CommandSettings] = r.CommandSettings(
    **{
        f.name: getattr(EXAMPLES[r.FindingSettings], f.name)
        for f in dataclasses.fields(r.FindingSettings)
    }
    | {"id": "speculator-5e77", "service": "speculator", "caused_by": ("detector-5e77",)}
)


def test_every_record_type_has_an_example() -> None:
    assert set(EXAMPLES) == set(r.RECORD_TYPES)


@pytest.mark.parametrize("cls", r.RECORD_TYPES, ids=lambda c: c.__name__)
def test_realistic_record_round_trips(codec: RecordCodec, cls: type[r.Record]) -> None:
    record = EXAMPLES[cls]
    data = codec.encode(record)
    assert isinstance(data, bytes)
    decoded = codec.decode(data)
    assert decoded == record
    assert type(decoded) is cls


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record=records())
def test_any_record_round_trips_single_object(record: r.Record) -> None:
    codec = SingleObjectCodec()
    assert codec.decode(codec.encode(record)) == record


# One registry for the whole property run: registering on every example is what a real
# producer does once, not per message.
_shared_confluent = _confluent()


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record=records())
def test_any_record_round_trips_confluent(record: r.Record) -> None:
    assert _shared_confluent.decode(_shared_confluent.encode(record)) == record


@pytest.mark.parametrize("cls", r.RECORD_TYPES, ids=lambda c: c.__name__)
@settings(max_examples=examples(30), deadline=None)
@given(data=st.data())
def test_each_record_type_round_trips_through_both_codecs(
    cls: type[r.Record], data: st.DataObject
) -> None:
    record = data.draw(record_of(cls))
    assert from_avro(cls, to_avro(record)) == record
    for codec in (SingleObjectCodec(), _shared_confluent):
        decoded = codec.decode(codec.encode(record))
        assert decoded == record and type(decoded) is cls


def test_decoded_values_have_python_types() -> None:
    codec = SingleObjectCodec()
    finding = codec.decode(codec.encode(EXAMPLES[r.SlowTasksDetected]))
    assert isinstance(finding, r.SlowTasksDetected)
    assert isinstance(finding.slow, tuple) and isinstance(finding.slow[0].live_attempts, tuple)
    assert isinstance(finding.hosts, tuple)
    failed = codec.decode(codec.encode(EXAMPLES[r.AttemptFailed]))
    assert isinstance(failed, r.AttemptFailed)
    assert failed.error is r.ErrorKind.PARTITION_MISSING
    assert isinstance(failed.missing_partition, r.PartitionRef)


def test_floats_round_trip_exactly() -> None:
    codec = SingleObjectCodec()
    base = EXAMPLES[r.SlowTasksDetected]
    assert isinstance(base, r.SlowTasksDetected)
    for value in (0.1, 1 / 3, 5e-324, 1.7976931348623157e308, -0.0, math.pi):
        decoded = codec.decode(codec.encode(dataclasses.replace(base, baseline_ns_per_byte=value)))
        assert isinstance(decoded, r.SlowTasksDetected)
        assert decoded.baseline_ns_per_byte is not None
        assert decoded.baseline_ns_per_byte.hex() == value.hex()


def test_single_object_decodes_messages_of_every_released_version() -> None:
    # The decoder learns released fingerprints from schemas/released/: a v1 producer's Tick and
    # a v2 producer's AttemptProgress both decode (v2 is the current release, same fingerprint).
    codec = SingleObjectCodec()
    released = released_schemas()
    assert {"v1", "v2"} <= set(released)
    for version, name in (("v1", "Tick"), ("v2", "Tick"), ("v2", "AttemptProgress")):
        record = EXAMPLES[r.RECORD_TYPES_BY_NAME[name]]
        body = codec.encode(record)[10:]
        assert codec.decode(MARKER + released[version][name].fingerprint + body) == record


def test_single_object_header_is_marker_and_little_endian_fingerprint() -> None:
    record = EXAMPLES[r.Tick]
    data = SingleObjectCodec().encode(record)
    assert data[:2] == b"\xc3\x01"
    assert data[2:10] == current_schemas()["Tick"].fingerprint


def test_confluent_registers_under_topic_record_name_subject_and_frames_with_its_id() -> None:
    codec = _confluent()
    data = codec.encode(EXAMPLES[r.BlockNodes])
    subject = "tailguard.commands-io.tailguard.BlockNodes"
    registered = codec.client.get_latest_version(subject)
    assert data[0] == 0
    assert int.from_bytes(data[1:5], "big") == registered.schema_id
    # Registration is lazy and once per type: a second record adds no version.
    codec.encode(EXAMPLES[r.BlockNodes])
    assert codec.client.get_versions(subject) == [registered.version]


def test_confluent_decodes_with_another_client_of_the_same_registry() -> None:
    url = next(_mock_urls)
    producer = codec_for({"schema-registry.url": url})
    consumer = codec_for({"schema-registry.url": url})
    assert isinstance(producer, ConfluentCodec) and isinstance(consumer, ConfluentCodec)
    record = EXAMPLES[r.JobSubmitted]
    assert consumer.decode(producer.encode(record)) == record


def test_codec_for_picks_the_framing_from_the_settings() -> None:
    assert isinstance(codec_for({}), SingleObjectCodec)
    assert isinstance(codec_for({"schema-registry.url": ""}), SingleObjectCodec)
    assert isinstance(codec_for({"schema-registry.url": "  "}), SingleObjectCodec)
    assert isinstance(codec_for(Settings()), SingleObjectCodec)
    chosen = codec_for(Settings({"schema-registry.url": next(_mock_urls)}))
    assert isinstance(chosen, ConfluentCodec) and chosen.name == "confluent"


def test_load_schemas_gives_a_parsed_schema_per_record_type() -> None:
    schemas = load_schemas()
    assert set(schemas) == set(r.RECORD_TYPES_BY_NAME)
    assert schemas["AttemptFinished"]["name"] == "io.tailguard.AttemptFinished"


def test_encoding_a_non_record_is_a_type_error(codec: RecordCodec) -> None:
    with pytest.raises(TypeError):
        codec.encode(r.TaskRef("v", 0))  # type: ignore[arg-type]


# --------------------------------------------------------------------------- error messages


def test_wrong_marker_is_named() -> None:
    data = SingleObjectCodec().encode(EXAMPLES[r.Tick])
    with pytest.raises(DecodeError, match="wrong marker"):
        SingleObjectCodec().decode(b"\x00\x01" + data[2:])
    with pytest.raises(DecodeError, match="wrong marker"):
        SingleObjectCodec().decode(b"")
    with pytest.raises(DecodeError, match="wrong marker"):
        _confluent().decode(data)


def test_unknown_fingerprint_is_named() -> None:
    data = SingleObjectCodec().encode(EXAMPLES[r.Tick])
    with pytest.raises(DecodeError, match="unknown schema fingerprint 0102030405060708"):
        SingleObjectCodec().decode(MARKER + bytes(range(1, 9)) + data[10:])


def test_unknown_schema_id_is_named() -> None:
    codec = _confluent()
    with pytest.raises(DecodeError, match="unknown schema id 4242"):
        codec.decode(b"\x00" + (4242).to_bytes(4, "big") + b"\x02j")


@pytest.mark.parametrize(
    "make", [SingleObjectCodec, _confluent], ids=["single-object", "confluent"]
)
def test_truncated_header_and_body_are_named(make: type[RecordCodec]) -> None:
    codec = make()
    data = codec.encode(EXAMPLES[r.AttemptFinished])
    header = 10 if isinstance(codec, SingleObjectCodec) else 5
    with pytest.raises(DecodeError, match="truncated header"):
        codec.decode(data[: header - 1])
    for cut in (header, header + 1, len(data) // 2, len(data) - 1):
        with pytest.raises(DecodeError, match="truncated AttemptFinished body"):
            codec.decode(data[:cut])


@pytest.mark.parametrize(
    "make", [SingleObjectCodec, _confluent], ids=["single-object", "confluent"]
)
def test_trailing_bytes_are_named(make: type[RecordCodec]) -> None:
    codec = make()
    data = codec.encode(EXAMPLES[r.NodeAdded])
    with pytest.raises(DecodeError, match="3 trailing bytes after the NodeAdded body"):
        codec.decode(data + b"abc")


def test_malformed_body_is_named() -> None:
    codec = SingleObjectCodec()
    data = codec.encode(EXAMPLES[r.JobFinished])
    # The status enum is the field after job_id, ts and id: replace its index with one past the
    # last symbol (zig-zag 3 -> 6), keeping the length the same.
    body = bytearray(data)
    status_at = len(data) - 2  # status index byte, then the empty message (length 0)
    assert body[status_at] == 0 and body[-1] == 0
    body[status_at] = 6
    with pytest.raises(DecodeError, match="malformed JobFinished body"):
        codec.decode(bytes(body))


def test_a_missing_value_is_a_decode_error(codec: RecordCodec) -> None:
    with pytest.raises(DecodeError, match="tombstone"):
        codec.decode(None)  # type: ignore[arg-type]
    record = EXAMPLES[r.Tick]
    assert codec.decode(bytearray(codec.encode(record))) == record  # type: ignore[arg-type]
    assert codec.decode(memoryview(codec.encode(record))) == record  # type: ignore[arg-type]
