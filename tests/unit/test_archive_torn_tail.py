"""An archive whose writer was killed mid-block (kill -9 during a flush) is continued after its
last complete block: the half-written block is cut, so the continued archive reads whole."""

from __future__ import annotations

from pathlib import Path

from tailguard.archive import ArchiveReader, ArchiveWriter
from tailguard.model import records as r


def tick(n: int) -> r.Tick:
    return r.Tick(job_id="job", ts=n, id=f"job-e{n}")


def test_a_torn_last_block_is_cut_before_the_archive_is_continued(tmp_path: Path) -> None:
    path = tmp_path / "job.avro"
    with ArchiveWriter(path, flush_every=2) as writer:
        for n in range(1, 5):
            writer.append(r.EVENTS_TOPIC, "published", tick(n), n)
    complete = path.stat().st_size
    # What a killed writer leaves: the start of a block (count, length, part of the data).
    with path.open("ab") as handle:
        handle.write(b"\x04\x80\x01" + b"\x00" * 20)
    assert ArchiveReader(path).complete_length() == complete
    assert [e.record.id for e in ArchiveReader(path)] == [f"job-e{n}" for n in range(1, 5)]

    with ArchiveWriter(path) as writer:
        writer.append(r.EVENTS_TOPIC, "published", tick(5), 5)
    assert [e.record.id for e in ArchiveReader(path)] == [f"job-e{n}" for n in range(1, 6)]


def test_a_whole_archive_is_continued_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "job.avro"
    with ArchiveWriter(path) as writer:
        writer.append(r.EVENTS_TOPIC, "published", tick(1), 1)
    size = path.stat().st_size
    assert ArchiveReader(path).complete_length() == size
    with ArchiveWriter(path) as writer:
        writer.append(r.EVENTS_TOPIC, "published", tick(2), 2)
    assert [e.record.id for e in ArchiveReader(path)] == ["job-e1", "job-e2"]
