"""Sink commit protocol: attempt-private staging, winner-only publication, safe sink reuse."""

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tailguard.agent.executor.sinks import (
    SINK_MARKER,
    SUCCESS_FILE,
    SinkNotEmpty,
    abort_staged,
    commit_sink_output,
    finalize_sink,
    prepare_sink,
    stage_sink_output,
)
from tailguard.agent.executor.storage import Storage

JOB = "job-7"


@pytest.fixture
def storage(tmp_path):
    return Storage(str(tmp_path / "store"))


@pytest.fixture
def sink(tmp_path):
    path = str(tmp_path / "out")
    prepare_sink(path)
    return path


def data(tag: str, n: int = 100) -> pa.Table:
    return pa.table({"i": list(range(n)), "tag": [tag] * n})


def parts(sink: str) -> list[str]:
    return sorted(n for n in os.listdir(sink) if n.startswith("part-"))


def test_two_attempts_stage_and_only_the_committed_one_appears(storage, sink):
    loser = stage_sink_output(storage, JOB, "sink", 3, 0, data("speculative-loser"))
    winner = stage_sink_output(storage, JOB, "sink", 3, 1, data("winner"))
    assert loser.path != winner.path
    assert os.path.getsize(winner.path) == winner.bytes
    assert parts(sink) == []  # staging publishes nothing

    commit_sink_output(storage, winner, sink)
    abort_staged(storage, loser)

    assert parts(sink) == ["part-00003.parquet"]
    assert pq.read_table(os.path.join(sink, "part-00003.parquet")).equals(data("winner"))
    assert not os.path.exists(loser.path)
    assert not os.path.exists(winner.path)
    assert not [n for n in os.listdir(sink) if n.startswith(".")]


def test_a_recommit_of_the_same_subtask_replaces_the_earlier_winner(storage, sink):
    first = stage_sink_output(storage, JOB, "sink", 0, 0, data("first", 10))
    commit_sink_output(storage, first, sink)
    second = stage_sink_output(storage, JOB, "sink", 0, 1, data("restarted", 20))
    commit_sink_output(storage, second, sink)
    assert parts(sink) == ["part-00000.parquet"]
    assert pq.read_table(os.path.join(sink, "part-00000.parquet")).equals(data("restarted", 20))


def test_full_output_reads_back_equal_to_the_input(storage, sink):
    tables = [data(f"s{i}", 50 + i) for i in range(4)]
    for subtask, table in enumerate(tables):
        commit_sink_output(
            storage, stage_sink_output(storage, JOB, "sink", subtask, 0, table), sink
        )
    finalize_sink(sink)
    assert os.path.exists(os.path.join(sink, SUCCESS_FILE))
    assert parts(sink) == [f"part-{i:05d}.parquet" for i in range(4)]
    read = pq.read_table(sink).sort_by([("tag", "ascending"), ("i", "ascending")])
    assert read.select(["i", "tag"]).equals(pa.concat_tables(tables).combine_chunks())


def test_checksum_is_deterministic_for_the_same_data(storage):
    a = stage_sink_output(storage, JOB, "sink", 0, 0, data("x"))
    b = stage_sink_output(storage, JOB, "sink", 0, 1, data("x"))
    c = stage_sink_output(storage, JOB, "sink", 0, 2, data("y"))
    assert a.checksum == b.checksum != c.checksum


def test_commit_refuses_a_staged_file_that_changed(storage, sink):
    staged = stage_sink_output(storage, JOB, "sink", 0, 0, data("x"))
    with open(staged.path, "ab") as f:
        f.write(b"garbage")
    with pytest.raises(OSError, match="expected"):
        commit_sink_output(storage, staged, sink)
    assert parts(sink) == []


def test_commit_to_a_file_uri_sink(storage, tmp_path):
    sink_uri = f"file://{tmp_path}/uri-out"
    prepare_sink(sink_uri)
    staged = stage_sink_output(storage, JOB, "sink", 1, 0, data("u"))
    published = commit_sink_output(storage, staged, sink_uri)
    assert published == f"{tmp_path}/uri-out/part-00001.parquet"
    assert pq.read_table(published).equals(data("u"))


def test_abort_of_an_already_gone_staging_is_fine(storage):
    staged = stage_sink_output(storage, JOB, "sink", 0, 0, data("x"))
    abort_staged(storage, staged)
    abort_staged(storage, staged)
    assert not os.path.exists(os.path.dirname(staged.path))


def test_prepare_sink_creates_and_marks_a_new_directory(tmp_path):
    path = tmp_path / "a" / "b"
    prepare_sink(str(path))
    assert os.listdir(path) == [SINK_MARKER]


def test_prepare_sink_refuses_a_foreign_non_empty_directory(tmp_path):
    path = tmp_path / "theirs"
    path.mkdir()
    (path / "important.csv").write_text("1,2\n")
    with pytest.raises(SinkNotEmpty):
        prepare_sink(str(path))
    assert os.listdir(path) == ["important.csv"]


def test_prepare_sink_clears_an_earlier_run_of_a_tailguard_sink(storage, tmp_path):
    path = str(tmp_path / "again")
    prepare_sink(path)
    for subtask in range(3):
        commit_sink_output(
            storage, stage_sink_output(storage, JOB, "s", subtask, 0, data("old")), path
        )
    finalize_sink(path)
    with open(os.path.join(path, ".part-00009.parquet.abc.tmp"), "wb") as f:
        f.write(b"crash leftover")
    with open(os.path.join(path, "README"), "w") as f:
        f.write("not ours: kept")

    prepare_sink(path)  # second run of the same job with fewer subtasks
    assert sorted(os.listdir(path)) == ["README", SINK_MARKER]
    commit_sink_output(storage, stage_sink_output(storage, "job-8", "s", 0, 0, data("new")), path)
    finalize_sink(path)
    assert parts(path) == ["part-00000.parquet"]
    published = pq.read_table(os.path.join(path, "part-00000.parquet"))
    assert published.column("tag").to_pylist() == ["new"] * 100


def test_commit_across_devices_copies_then_renames(storage, tmp_path):
    shm = "/dev/shm"
    if not os.path.isdir(shm) or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs a second local device (/dev/shm as tmpfs) to make rename fail")
    import tempfile

    with tempfile.TemporaryDirectory(dir=shm) as other_device:
        sink_path = os.path.join(other_device, "out")
        prepare_sink(sink_path)
        old = stage_sink_output(storage, JOB, "sink", 2, 0, data("old"))
        commit_sink_output(storage, old, sink_path)
        new = stage_sink_output(storage, JOB, "sink", 2, 1, data("new"))
        commit_sink_output(storage, new, sink_path)
        assert sorted(os.listdir(sink_path)) == [SINK_MARKER, "part-00002.parquet"]
        published = pq.read_table(os.path.join(sink_path, "part-00002.parquet"))
        assert published.equals(data("new"))
        assert not os.path.exists(new.path)
