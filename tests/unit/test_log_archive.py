"""The per-job Avro archive: order, visibility while writing, damaged and foreign files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import fastavro
import pyarrow.fs as pafs
import pytest

from tailguard import filesystems
from tailguard.archive import (
    PARTS_SUFFIX,
    ArchiveError,
    ArchiveReader,
    ArchiveWriter,
    Direction,
    Envelope,
)
from tailguard.model.records import NodeAdded, Record, Tick


def record(i: int) -> Record:
    # Two types, so that entries take different branches of the archive's union.
    if i % 4 == 3:
        return NodeAdded(job_id="job-1", ts=i, id=f"e{i}", host=f"h{i % 5}", slots=i % 3)
    return Tick(job_id="job-1", ts=i, id=f"e{i}")


def envelopes(n: int, start: int = 0) -> list[Envelope]:
    directions = list(Direction)
    return [
        Envelope(f"topic-{i % 2}", 1_000 + i, directions[i % 3], record(i))
        for i in range(start, start + n)
    ]


def write(writer: ArchiveWriter, items: list[Envelope]) -> None:
    for e in items:
        writer.append(e.topic, e.direction, e.record, e.ts)


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


def test_unknown_direction_and_non_records_are_refused(tmp_path: Path) -> None:
    with ArchiveWriter(tmp_path / "a.avro") as writer:
        with pytest.raises(ValueError):
            writer.append("t", "sideways", record(1), 1)
        with pytest.raises(TypeError, match="no schema for bytes"):
            writer.append("t", "local", b"x", 1)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- at a URI
# pyarrow's in-memory mock:// filesystem stands in for a store; against a real S3-protocol
# server, see tests/integration/test_s3.py.


def remote_archive(tmp_path: Path, name: str, **kwargs: Any) -> tuple[str, ArchiveWriter]:
    location = f"mock:///archives/{name}.avro"
    kwargs.setdefault("upload_interval_s", 3600)
    return location, ArchiveWriter(location, spool_dir=tmp_path / "spool", **kwargs)


def test_a_remote_archive_is_read_from_its_parts_until_closed(tmp_path: Path) -> None:
    location, writer = remote_archive(tmp_path, "parts", flush_every=10)
    items = envelopes(35)
    write(writer, items[:20])
    writer.sync()
    write(writer, items[20:30])
    writer.sync()
    write(writer, items[30:])  # flushed by nobody yet
    assert list(ArchiveReader(location)) == items[:30]
    fs, inner = filesystems.open_location(location)
    parts = fs.get_file_info(pafs.FileSelector(inner + PARTS_SUFFIX))
    assert len(parts) == 3  # the header, then one part per sync
    writer.close()
    assert list(ArchiveReader(location)) == items
    assert fs.get_file_info(inner + PARTS_SUFFIX).type == pafs.FileType.NotFound


def test_parts_already_inside_the_object_are_skipped_and_a_gap_is_an_error(
    tmp_path: Path,
) -> None:
    location, writer = remote_archive(tmp_path, "gap", flush_every=5)
    items = envelopes(15)
    write(writer, items)
    writer.close()
    fs, inner = filesystems.open_location(location)
    whole = fs.open_input_stream(inner).read()
    # A writer that closed after a reader listed its parts: the parts lie inside the object.
    filesystems.put(fs, f"{inner}{PARTS_SUFFIX}/{0:020d}", whole[:100])
    assert list(ArchiveReader(location)) == items
    # A part that does not follow what came before: bytes are missing, which is damage.
    filesystems.put(fs, f"{inner}{PARTS_SUFFIX}/{len(whole) + 10:020d}", b"x")
    with pytest.raises(ArchiveError, match=r"bytes \d+ to \d+ are missing"):
        list(ArchiveReader(location))


def test_a_failed_part_upload_is_retried_from_the_same_offset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    location, writer = remote_archive(tmp_path, "retry", flush_every=5)
    items = envelopes(10)
    real_put = filesystems.put
    failures = [OSError("the store is unreachable")]

    def flaky_put(fs: Any, path: str, data: bytes) -> None:
        if failures and PARTS_SUFFIX in path:
            raise failures.pop()
        real_put(fs, path, data)

    monkeypatch.setattr(filesystems, "put", flaky_put)
    write(writer, items[:5])
    writer.flush()
    writer._remote.upload(writer.path, writer._file.tell())  # type: ignore[union-attr]
    write(writer, items[5:])
    writer.sync()  # the bytes of the failed part go up with these
    assert list(ArchiveReader(location)) == items
    writer.close()


def test_remote_writer_fails_at_once_where_it_cannot_write(tmp_path: Path) -> None:
    with pytest.raises(ArchiveError, match=r"nosuch://bucket/a\.avro"):
        ArchiveWriter("nosuch://bucket/a.avro", spool_dir=tmp_path)


def test_remote_writer_refuses_a_foreign_object_and_leaves_it(tmp_path: Path) -> None:
    fs, inner = filesystems.open_location("mock:///archives/foreign.avro")
    filesystems.put(fs, inner, b"not an archive")
    with pytest.raises(ArchiveError, match=r"mock:///archives/foreign\.avro holds no tailguard"):
        ArchiveWriter("mock:///archives/foreign.avro", spool_dir=tmp_path)
    assert fs.open_input_stream(inner).read() == b"not an archive"
    assert list(tmp_path.iterdir()) == []
