"""`export`: one row per archived record, in JSON Lines and Parquet."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from tests.unit.inspect_records import DEMO_ARCHIVE, DEMO_HEAD, DEMO_LAUNCH, JobLog

from tailguard.archive import ArchiveWriter, Direction
from tailguard.cli import main
from tailguard.codec import current_schemas, from_avro
from tailguard.inspect.describe import COMMON_FIELDS
from tailguard.inspect.export import arrow_schema
from tailguard.inspect.reading import archived
from tailguard.model import records as r
from tailguard.model.config import REDACTED, Settings


@pytest.fixture(scope="module")
def demo_entries() -> list:
    return list(archived(str(DEMO_ARCHIVE), Settings()))


def test_jsonl_rows_give_back_every_record(tmp_path: Path, demo_entries: list) -> None:
    out = tmp_path / "demo.jsonl"
    assert main(["export", str(DEMO_ARCHIVE), "--format", "jsonl", "-o", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == len(demo_entries) == 145
    for n, (row, entry) in enumerate(zip(rows, demo_entries, strict=True)):
        record = entry.record
        assert row["position"] == n
        assert (row["type"], row["id"], row["ts"]) == (type(record).__name__, record.id, record.ts)
        assert (row["topic"], row["direction"]) == (record.TOPIC, entry.direction)
        assert row["archived_ts"] == entry.archived_ts
        # The row holds the whole record: it converts back to an equal one.
        datum = {"job_id": row["job_id"], "ts": row["ts"], "id": row["id"], **row["fields"]}
        if isinstance(record, r.Finding | r.Command):
            datum["caused_by"] = row["caused_by"]
        else:
            assert row["caused_by"] == []
        assert from_avro(type(record), datum) == record
    launch = next(row for row in rows if row["id"] == DEMO_LAUNCH)
    assert launch["direction"] == "received" and launch["caused_by"][0].startswith("detector-")


def test_parquet_has_typed_columns_per_record_type(tmp_path: Path, demo_entries: list) -> None:
    out = tmp_path / "demo.parquet"
    assert main(["export", str(DEMO_ARCHIVE), "--format", "parquet", "-o", str(out)]) == 0
    table = pq.read_table(out)
    assert table.num_rows == len(demo_entries)
    assert str(table.schema.field("ts").type) == "timestamp[ms, tz=UTC]"
    copies = table.filter(pc.equal(table["type"], "AttemptDeploying")).column("AttemptDeploying")
    speculative = [d for d in copies.to_pylist() if d["speculative"]]
    assert speculative == [
        {
            "vertex": DEMO_HEAD,
            "subtask": 2,
            "attempt": 1,
            "host": "127.0.0.2",
            "speculative": True,
            "command_id": DEMO_LAUNCH,
        }
    ]
    # A row has its own type's column only.
    ticks = table.filter(pc.equal(table["type"], "Tick"))
    assert ticks.column("AttemptDeploying").null_count == ticks.num_rows > 0
    submitted = table.filter(pc.equal(table["type"], "JobSubmitted"))["JobSubmitted"]
    config = dict(submitted[0]["config"].as_py())
    assert config["blocklist.min-slow-attempts"] == "1"


def test_every_record_type_with_fields_has_a_column() -> None:
    schema = arrow_schema()
    for name, record_schema in current_schemas().items():
        own = [f["name"] for f in record_schema.parsed["fields"] if f["name"] not in COMMON_FIELDS]
        if own:
            assert schema.field(name).type.names == own
        else:
            assert name not in schema.names


def test_secrets_in_an_old_jobs_config_are_not_exported(tmp_path: Path) -> None:
    log = JobLog()
    log.submitted({"kafka.sasl.password": "hunter2", "blocklist.min-slow-attempts": "1"})
    archive = tmp_path / "old.avro"
    with ArchiveWriter(archive) as writer:
        for record in log.records:
            writer.append(record.TOPIC, Direction.PUBLISHED, record, record.ts)
    for form in ("jsonl", "parquet"):
        out = tmp_path / f"old.{form}"
        assert main(["export", str(archive), "--format", form, "-o", str(out)]) == 0
        assert b"hunter2" not in out.read_bytes()
    (row,) = [json.loads(line) for line in (tmp_path / "old.jsonl").read_text().splitlines()]
    assert row["fields"]["config"] == {
        "kafka.sasl.password": REDACTED,
        "blocklist.min-slow-attempts": "1",
    }


def test_bad_requests_fail_clearly_and_leave_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "x.parquet"
    assert main(["export", str(DEMO_ARCHIVE), "--format", "parquet", "-o", "-"]) == 2
    assert "parquet cannot go to standard output" in capsys.readouterr().err
    assert main(["export", __file__, "--format", "parquet", "-o", str(out)]) == 2
    assert "not an Avro object container file" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_jsonl_to_standard_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", str(DEMO_ARCHIVE), "-o", "-"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 145 and json.loads(lines[0])["type"] == "JobSubmitted"
