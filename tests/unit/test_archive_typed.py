"""The typed archive: plain Avro readers get the records; old archives stay readable; the union
of record types evolves by appending, and what an older reader then cannot read is named.

The recorded archives in `recorded/` are of the older format (each record as its encoded bytes):
`demo-speculation.avro` from a real demo run, `replay-v3-envelopes.avro` written by the archive
writer of schema release v3 just before the typed archive (published, received, local and
`.unauthenticated` entries).
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import avro.schema
import fastavro
import pytest
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.examples_budget import examples
from tests.strategies import records

from tailguard.archive import ArchiveError, ArchiveReader, ArchiveWriter, Direction, Envelope
from tailguard.archive.entries import LEGACY_SCHEMA, entry_schema
from tailguard.codec import SingleObjectCodec, to_avro
from tailguard.codec.record_union import current_union, record_union, release_union
from tailguard.codec.schemas import current_schemas, released_schemas
from tailguard.inspect.reading import archived
from tailguard.model import records as r
from tailguard.model.authority import UNAUTHENTICATED_COMMANDS_TOPIC
from tailguard.model.config import Settings
from tailguard.replay.engine import replay
from tailguard.replay.inputs import read_archive

RECORDED = Path(__file__).parent / "recorded"
OLD_ARCHIVES = [RECORDED / "demo-speculation.avro", RECORDED / "replay-v3-envelopes.avro"]


def plain(value: Any) -> Any:
    """What an Avro reader gives for a record's value, worked out from the dataclass alone (not
    through tailguard's codec): records are dicts, enums their symbol, tuples lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, tuple | list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def expected_row(envelope: Envelope) -> dict[str, Any]:
    record = envelope.record
    return {
        "topic": envelope.topic,
        "ts": envelope.ts,
        "direction": envelope.direction.value,
        "type": type(record).__name__,
        "job_id": record.job_id,
        "id": record.id,
        "record": plain(record),
    }


def write(path: Path, entries: list[Envelope]) -> None:
    with ArchiveWriter(path, flush_every=7) as writer:
        for e in entries:
            writer.append(e.topic, e.direction, e.record, e.ts)


def old_entries(path: Path) -> list[Envelope]:
    """An old-format archive's entries, read with fastavro and decoded with the codec: apart
    from the archive's own reader."""
    codec = SingleObjectCodec()
    with path.open("rb") as handle:
        return [
            Envelope(
                row["topic"], row["ts"], Direction(row["direction"]), codec.decode(row["payload"])
            )
            for row in fastavro.reader(handle)
        ]


# --------------------------------------------------------------------- plain Avro readers


@settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    st.lists(
        st.tuples(records(), st.sampled_from(list(Direction)), st.integers(0, 2**40)),
        min_size=1,
        max_size=25,
    )
)
def test_fastavro_alone_reads_typed_records_of_every_type(
    tmp_path: Path, drawn: list[tuple[r.Record, Direction, int]]
) -> None:
    path = tmp_path / "any.avro"
    path.unlink(missing_ok=True)
    entries = [Envelope(rec.TOPIC, ts, d, rec) for rec, d, ts in drawn]
    write(path, entries)
    with path.open("rb") as handle:
        rows = list(fastavro.reader(handle))
    assert rows == [expected_row(e) for e in entries]
    assert list(ArchiveReader(path)) == entries


READ_WITHOUT_TAILGUARD = """
import json, sys
kind, path = sys.argv[1:]
if kind == "fastavro":
    import fastavro
    with open(path, "rb") as handle:
        rows = list(fastavro.reader(handle))
else:
    import avro.datafile, avro.io
    with avro.datafile.DataFileReader(open(path, "rb"), avro.io.DatumReader()) as reader:
        rows = list(reader)
assert not [m for m in sys.modules if m.startswith("tailguard")]
print(json.dumps(rows))
"""


@pytest.mark.parametrize("kind", ["fastavro", "avro"])
def test_a_plain_avro_reader_gets_the_typed_records_of_real_jobs(tmp_path: Path, kind: str) -> None:
    """The acceptance test: a process that never imports tailguard reads a real job's archive
    (both recorded histories, rewritten by today's writer) with fastavro or Apache's `avro`
    package, and gets each record's fields, its type and the envelope fields replay needs."""
    entries = [e for path in OLD_ARCHIVES for e in old_entries(path)]
    path = tmp_path / "job.avro"
    write(path, entries)
    read = subprocess.run(
        [sys.executable, "-c", READ_WITHOUT_TAILGUARD, kind, str(path)],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    rows = json.loads(read.stdout)
    assert rows == [expected_row(e) for e in entries]
    kept = {(row["topic"], row["direction"]) for row in rows}
    assert (UNAUTHENTICATED_COMMANDS_TOPIC, "received") in kept
    assert (r.COMMANDS_TOPIC, "local") in kept
    assert len({row["type"] for row in rows}) >= 18


# --------------------------------------------------------------------- old archives


@pytest.mark.parametrize("path", OLD_ARCHIVES, ids=lambda p: p.name)
def test_old_archives_read_as_they_were_written(path: Path, tmp_path: Path) -> None:
    entries = list(ArchiveReader(path))
    assert entries == old_entries(path) and entries
    # Rewritten by today's writer, they read back the same.
    write(tmp_path / "typed.avro", entries)
    assert list(ArchiveReader(tmp_path / "typed.avro")) == entries
    # Replay and the inspect commands read them too.
    replayed = [x.record for x in read_archive(path, Settings())]
    assert replayed == [e.record for e in entries]
    inspected = list(archived(str(path), Settings()))
    assert [(a.topic, a.direction, a.archived_ts) for a in inspected] == [
        (e.topic, e.direction.value, e.ts) for e in entries
    ]


def test_export_keeps_the_archived_topic(tmp_path: Path) -> None:
    from tailguard.cli import main

    out = tmp_path / "v3.jsonl"
    assert main(["export", str(OLD_ARCHIVES[1]), "--format", "jsonl", "-o", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    forged = [row for row in rows if row["id"] == "failover-0badc0de"]
    assert [(row["topic"], row["type"]) for row in forged] == [
        (UNAUTHENTICATED_COMMANDS_TOPIC, "FailJob")
    ]
    assert len(rows) == len(old_entries(OLD_ARCHIVES[1]))


def test_a_replay_of_the_v3_archive_reproduces_it_and_reports_the_forgery() -> None:
    from tests.unit.speculation_histories import SIMULATION_CONFIG

    path = RECORDED / "replay-v3-envelopes.avro"
    for log in (read_archive(path, Settings()), _typed_copy(path)):
        report = replay(log, Settings(SIMULATION_CONFIG))
        assert report.differences == 0, [s.line() for s in report.services]
        assert [x.command.id for x in report.rejected] == ["failover-0badc0de"]
        assert sum(s.reproduced for s in report.services) >= 19


def _typed_copy(path: Path) -> Any:
    from tailguard.replay.engine import Recorded

    return [Recorded(e.topic, e.record) for e in old_entries(path)]


def test_an_old_archive_is_not_continued_and_a_bad_payload_is_named(tmp_path: Path) -> None:
    old = tmp_path / "old.avro"
    shutil.copy(OLD_ARCHIVES[1], old)
    with pytest.raises(ArchiveError, match="another version of tailguard"):
        ArchiveWriter(old)
    assert old.read_bytes() == OLD_ARCHIVES[1].read_bytes()

    tick = r.Tick(job_id="j", ts=1, id="e1")
    damaged = tmp_path / "damaged.avro"
    with damaged.open("wb") as handle:
        fastavro.writer(
            handle,
            fastavro.parse_schema(copy.deepcopy(LEGACY_SCHEMA)),
            [
                {"topic": r.EVENTS_TOPIC, "ts": 1, "direction": "published", "payload": p}
                for p in (SingleObjectCodec().encode(tick), b"\xc3\x01junk")
            ],
        )
    reader = iter(ArchiveReader(damaged))
    assert next(reader).record == tick
    with pytest.raises(ArchiveError, match=r"damaged\.avro: entry 1 does not decode: truncated"):
        next(reader)


# --------------------------------------------------------------------- schema evolution


def names(union: list[Any]) -> list[str]:
    return [s.record_type.__name__ for s in union]


def test_the_union_only_ever_appends_record_types() -> None:
    current = names(current_union())
    assert sorted(current) == sorted(current_schemas())
    for version in released_schemas():
        release = names(release_union(version))
        assert current[: len(release)] == release, f"{version}'s branches moved"
    # v2 added AttemptProgress: it follows every type of v1.
    assert current.index("AttemptProgress") == len(released_schemas()["v1"])


def _compatibility(reader: dict[str, Any], writer: dict[str, Any]) -> Any:
    return ReaderWriterCompatibilityChecker().get_compatibility(
        avro.schema.parse(json.dumps(reader)), avro.schema.parse(json.dumps(writer))
    )


@pytest.mark.parametrize("version", sorted(released_schemas()))
def test_todays_entries_read_the_entries_of_every_release(version: str) -> None:
    today = entry_schema(current_union())
    result = _compatibility(today, entry_schema(release_union(version)))
    assert result.compatibility is SchemaCompatibilityType.compatible, result.messages


def test_an_older_reader_cannot_read_a_type_added_later() -> None:
    # The limit of any union that grows (Avro resolves branches by name): the v1 entry schema
    # cannot read an AttemptProgress. The archive reader turns that into a per-entry error
    # (test below); plain Avro readers read with the file's own schema and are not affected.
    result = _compatibility(entry_schema(release_union("v1")), entry_schema(current_union()))
    assert result.compatibility is SchemaCompatibilityType.incompatible


def _write_with(path: Path, schema: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    with path.open("wb") as handle:
        fastavro.writer(handle, fastavro.parse_schema(schema, named_schemas={}), rows)


def _row(record: r.Record, datum: dict[str, Any], branch: str | None = None) -> dict[str, Any]:
    return {
        "topic": record.TOPIC,
        "ts": record.ts,
        "direction": "published",
        "type": branch or type(record).__name__,
        "job_id": record.job_id,
        "id": record.id,
        "record": (f"io.tailguard.{branch or type(record).__name__}", datum),
    }


def test_an_archive_of_an_older_release_reads_as_todays_records(tmp_path: Path) -> None:
    # Written with v1's union: no AttemptProgress branch, and AttemptFailed without the
    # non_recoverable field v3 added (default false).
    failed = r.AttemptFailed(
        job_id="j",
        ts=5,
        id="e5",
        vertex="v",
        subtask=1,
        attempt=0,
        host="h",
        error=r.ErrorKind.USER,
        message="boom",
    )
    v1_failed = {k: v for k, v in to_avro(failed).items() if k != "non_recoverable"}
    tick = r.Tick(job_id="j", ts=6, id="e6")
    path = tmp_path / "v1.avro"
    _write_with(
        path,
        entry_schema(release_union("v1")),
        [_row(failed, v1_failed), _row(tick, to_avro(tick))],
    )
    assert [e.record for e in ArchiveReader(path)] == [failed, tick]
    with pytest.raises(ArchiveError, match="another version of tailguard"):
        ArchiveWriter(path)


def test_a_type_this_version_does_not_know_is_named_and_the_rest_is_read(tmp_path: Path) -> None:
    """An archive from a newer tailguard with a record type added after this one: entries
    before it read, that entry is an error naming its type, and plain readers read it all."""
    tick = current_schemas()["Tick"]
    future = dataclasses.replace(tick, raw={**copy.deepcopy(tick.raw), "name": "FutureFinding"})
    schema = entry_schema([*current_union(), future])
    first, later = r.Tick(job_id="j", ts=1, id="e1"), r.Tick(job_id="j", ts=3, id="e3")
    rows = [
        _row(first, to_avro(first)),
        _row(first, {"job_id": "j", "ts": 2, "id": "f2"}, branch="FutureFinding"),
        _row(later, to_avro(later)),
    ]
    path = tmp_path / "newer.avro"
    _write_with(path, schema, rows)
    entries = iter(ArchiveReader(path))
    assert next(entries).record == first
    with pytest.raises(ArchiveError, match="entry 1 is a FutureFinding record, a type this"):
        next(entries)
    with path.open("rb") as handle:
        assert [row["type"] for row in fastavro.reader(handle)] == ["Tick", "FutureFinding", "Tick"]


def test_one_definition_per_named_type_and_a_clash_is_refused() -> None:
    union = record_union(current_union())
    text = json.dumps(union)
    # Defined in both AttemptFailed and SetParallelism's files, once in the union.
    assert text.count('"name": "PartitionRef"') == 1
    assert text.count('"name": "InputRange"') == 1
    tick, node = current_schemas()["Tick"], current_schemas()["NodeAdded"]

    def with_enum(schema: Any, symbols: list[str]) -> Any:
        raw = copy.deepcopy(schema.raw)
        raw["fields"].append(
            {"name": "x", "type": {"type": "enum", "name": "Clash", "symbols": symbols}}
        )
        return dataclasses.replace(schema, raw=raw)

    same: Any = record_union([with_enum(tick, ["A"]), with_enum(node, ["A"])])
    assert same[1]["fields"][-1]["type"] == "io.tailguard.Clash"
    with pytest.raises(ValueError, match=r"define io\.tailguard\.Clash differently"):
        record_union([with_enum(tick, ["A"]), with_enum(node, ["B"])])
