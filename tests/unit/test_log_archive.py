"""The per-job Avro archive: order, visibility while writing, damaged and foreign files."""

from __future__ import annotations

from pathlib import Path

import fastavro
import pytest

from tailguard.codec import codec_for
from tailguard.log.archive import ArchiveError, ArchiveReader, ArchiveWriter, Direction, Envelope
from tailguard.model.config import Settings
from tailguard.model.records import Tick


def envelopes(n: int, start: int = 0) -> list[Envelope]:
    directions = list(Direction)
    return [
        Envelope(f"topic-{i % 2}", 1_000 + i, directions[i % 3], f"payload {i}".encode())
        for i in range(start, start + n)
    ]


def write(writer: ArchiveWriter, items: list[Envelope]) -> None:
    for e in items:
        writer.append(e.topic, e.direction, e.payload, e.ts)


def test_round_trip_in_order(tmp_path: Path) -> None:
    items = envelopes(250)
    with ArchiveWriter(tmp_path / "a.avro", flush_every=40) as writer:
        write(writer, items)
    assert list(ArchiveReader(tmp_path / "a.avro")) == items
    # A standard Avro container file: any Avro reader can read it.
    with (tmp_path / "a.avro").open("rb") as handle:
        assert len(list(fastavro.reader(handle))) == len(items)


def test_reader_sees_flushed_records_while_writer_runs(tmp_path: Path) -> None:
    path = tmp_path / "live.avro"
    writer = ArchiveWriter(path, flush_every=10)
    assert list(ArchiveReader(path)) == []  # the header is out before any record
    items = envelopes(25)
    write(writer, items)
    # Two full blocks of 10 went out by themselves; the last 5 wait for a flush.
    assert list(ArchiveReader(path)) == items[:20]
    writer.flush()
    assert list(ArchiveReader(path)) == items
    writer.close()


def test_writer_continues_an_existing_archive(tmp_path: Path) -> None:
    path = tmp_path / "job.avro"
    first, second = envelopes(5), envelopes(5, start=5)
    with ArchiveWriter(path) as writer:
        write(writer, first)
    with ArchiveWriter(path) as writer:
        write(writer, second)
    assert list(ArchiveReader(path)) == first + second


def test_incomplete_final_block_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "job.avro"
    items = envelopes(30)
    with ArchiveWriter(path, flush_every=10) as writer:
        write(writer, items)
    data = path.read_bytes()
    for cut in (1, 5, 17, 40):
        (tmp_path / "cut.avro").write_bytes(data[:-cut])
        assert list(ArchiveReader(tmp_path / "cut.avro")) == items[:20]


def test_damaged_block_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "job.avro"
    with ArchiveWriter(path, flush_every=10) as writer:
        write(writer, envelopes(30))
    data = bytearray(path.read_bytes())
    # Overwrite the sync marker that ends the first block: everything after it is suspect.
    sync = bytes(data[-16:])
    first_end = data.index(sync, data.index(sync) + 16)
    data[first_end] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ArchiveError, match="damaged block"):
        list(ArchiveReader(path))


def test_bad_paths_and_foreign_files(tmp_path: Path) -> None:
    with pytest.raises(ArchiveError, match="no archive"):
        ArchiveReader(tmp_path / "missing.avro")
    (tmp_path / "text.avro").write_text("hello")
    with pytest.raises(ArchiveError, match="not an Avro"):
        ArchiveReader(tmp_path / "text.avro")
    with pytest.raises(ArchiveError, match="not an Avro"):
        ArchiveWriter(tmp_path / "text.avro")
    other = tmp_path / "other.avro"
    with other.open("wb") as handle:
        fastavro.writer(
            handle, {"type": "record", "name": "X", "fields": [{"name": "a", "type": "int"}]}, []
        )
    with pytest.raises(ArchiveError, match="not a tailguard archive"):
        ArchiveReader(other)


def test_unknown_direction_is_refused(tmp_path: Path) -> None:
    with ArchiveWriter(tmp_path / "a.avro") as writer, pytest.raises(ValueError):
        writer.append("t", "sideways", b"x", 1)


def test_records_decodes_payloads(tmp_path: Path) -> None:
    codec = codec_for(Settings())
    ticks = [Tick(job_id="job-1", ts=ts, id=f"job-1-e{ts}") for ts in range(20)]
    with ArchiveWriter(tmp_path / "a.avro") as writer:
        for tick in ticks:
            writer.append(tick.TOPIC, Direction.PUBLISHED, codec.encode(tick), tick.ts)
    pairs = list(ArchiveReader(tmp_path / "a.avro").records(codec))
    assert [record for _, record in pairs] == ticks
    assert all(env.direction is Direction.PUBLISHED for env, _ in pairs)
