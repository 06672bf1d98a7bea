"""Result partitions as files: layout, checksums, verified reads, release and sweeping."""

import os
import threading

import pyarrow as pa
import pytest

from tailguard.agent.executor.partitions import (
    JobOwner,
    PartitionCorrupt,
    PartitionMissing,
    await_partition,
    completion_marker_path,
    local_owner_alive,
    mark_job_running,
    prepare_job_storage,
    read_completion,
    read_job_owner,
    read_subpartitions,
    release_partition,
    subpartition_path,
    sweep_abandoned,
    sweep_job,
    write_partition,
)
from tailguard.agent.executor.storage import Storage
from tailguard.model.records import PartitionRef

JOB = "job-1"


@pytest.fixture
def storage(tmp_path):
    return Storage(str(tmp_path))


def table(start: int, n: int) -> pa.Table:
    return pa.table(
        {
            "k": pa.array(range(start, start + n), pa.int64()),
            "s": pa.array([None if i % 7 == 0 else f"v{i}" for i in range(start, start + n)]),
        }
    )


def checksums_of(written, subtask):
    return {(subtask, sp): c for sp, c in enumerate(written.checksums)}


def test_layout_sizes_and_records(storage, tmp_path):
    ref = PartitionRef("map", 3, 1)
    written = write_partition(storage, JOB, ref, [table(0, 10), table(10, 5), table(0, 0)])
    directory = tmp_path / JOB / "partitions" / "map" / "3" / "1"
    assert sorted(os.listdir(directory)) == ["0.arrow", "1.arrow", "2.arrow", "_complete.json"]
    assert written.records == 15
    assert written.bytes_per_subpartition == tuple(
        os.path.getsize(directory / f"{sp}.arrow") for sp in range(3)
    )
    assert len(set(written.checksums)) == 3


def test_completion_marker_records_what_was_written(storage):
    ref = PartitionRef("map", 1, 2)
    with pytest.raises(FileNotFoundError):
        read_completion(storage, JOB, ref)
    written = write_partition(storage, JOB, ref, [table(0, 10), table(10, 4)])
    assert read_completion(storage, JOB, ref) == written


def test_await_partition_returns_once_the_producer_completes(storage):
    ref = PartitionRef("map", 0, 0)
    done: list[object] = []
    waiter = threading.Thread(
        target=lambda: done.append(await_partition(storage, JOB, ref, 30.0, lambda: None, 0.01))
    )
    waiter.start()
    # Subpartition files without the marker are not a complete partition yet.
    storage.write_atomic(subpartition_path(storage, JOB, ref, 0), b"partial")
    waiter.join(0.2)
    assert waiter.is_alive()
    written = write_partition(storage, JOB, ref, [table(0, 3)])
    waiter.join(10)
    assert done == [written]


def test_await_partition_stops_on_abandon_and_on_the_deadline(storage):
    ref = PartitionRef("map", 0, 5)
    reasons = iter([None, None, "the producer attempt was cancelled"])
    with pytest.raises(PartitionMissing, match="producer attempt was cancelled") as err:
        await_partition(storage, JOB, ref, 30.0, lambda: next(reasons), 0.001)
    assert err.value.partition == ref
    with pytest.raises(PartitionMissing, match="not complete within"):
        await_partition(storage, JOB, ref, 0.05, lambda: None, 0.01)


def test_unreadable_completion_marker_is_corrupt(storage):
    ref = PartitionRef("map", 0, 0)
    storage.write_atomic(completion_marker_path(storage, JOB, ref), b"{not json")
    with pytest.raises(PartitionCorrupt):
        read_completion(storage, JOB, ref)


def test_empty_subpartition_file_carries_the_schema(storage):
    ref = PartitionRef("map", 0, 0)
    written = write_partition(storage, JOB, ref, [table(0, 0)])
    got, _ = read_subpartitions(
        storage, JOB, "map", {0: 0}, (0, 0), (0, 0), checksums_of(written, 0)
    )
    assert got.num_rows == 0
    assert got.schema.names == ["k", "s"]


def test_same_data_gives_same_checksums_however_it_is_chunked(storage):
    data = table(0, 200_000)
    first = write_partition(storage, JOB, PartitionRef("m", 0, 0), [data, table(5, 3)])
    again = write_partition(storage, JOB, PartitionRef("m", 0, 1), [data, table(5, 3)])
    rechunked = pa.concat_tables([data.slice(0, 1234), data.slice(1234)])
    regrouped = write_partition(storage, JOB, PartitionRef("m", 0, 2), [rechunked, table(5, 3)])
    assert first.checksums == again.checksums == regrouped.checksums
    assert first.bytes_per_subpartition == regrouped.bytes_per_subpartition


def test_a_slice_and_a_fresh_table_of_the_same_rows_agree(storage):
    base = table(0, 100)
    sliced = write_partition(storage, JOB, PartitionRef("m", 0, 0), [base.slice(13, 50)])
    fresh = write_partition(storage, JOB, PartitionRef("m", 0, 1), [table(13, 50)])
    assert sliced.checksums == fresh.checksums


def test_different_data_gives_different_checksums(storage):
    a = write_partition(storage, JOB, PartitionRef("m", 0, 0), [table(0, 100)])
    b = write_partition(storage, JOB, PartitionRef("m", 0, 1), [table(1, 100)])
    changed = table(0, 100).set_column(1, "s", pa.array(["x"] * 100))
    c = write_partition(storage, JOB, PartitionRef("m", 0, 2), [changed])
    assert len({a.checksums[0], b.checksums[0], c.checksums[0]}) == 3


def test_reads_the_ranges_of_the_winning_attempts_in_order(storage):
    sums: dict[tuple[int, int], str] = {}
    for subtask in range(3):
        parts = [table(100 * subtask + 10 * sp, 2) for sp in range(4)]
        # A losing attempt with other data must not be read.
        write_partition(storage, JOB, PartitionRef("p", subtask, 0), [table(999, 1)] * 4)
        sums.update(
            checksums_of(
                write_partition(storage, JOB, PartitionRef("p", subtask, 1), parts), subtask
            )
        )
    got, read_bytes = read_subpartitions(storage, JOB, "p", {1: 1, 2: 1}, (1, 2), (1, 2), sums)
    assert got.column("k").to_pylist() == [110, 111, 120, 121, 210, 211, 220, 221]
    expected_bytes = sum(
        storage.size(subpartition_path(storage, JOB, PartitionRef("p", st, 1), sp))
        for st in (1, 2)
        for sp in (1, 2)
    )
    assert read_bytes == expected_bytes


def test_trivially_different_schemas_are_unified(storage):
    typed = pa.table({"k": pa.array([1, 2], pa.int64()), "s": pa.array(["a", None])})
    all_null = pa.table({"k": pa.array([3], pa.int64()), "s": pa.array([None], pa.null())})
    w0 = write_partition(storage, JOB, PartitionRef("p", 0, 0), [typed])
    w1 = write_partition(storage, JOB, PartitionRef("p", 1, 0), [all_null])
    sums = {**checksums_of(w0, 0), **checksums_of(w1, 1)}
    got, _ = read_subpartitions(storage, JOB, "p", {0: 0, 1: 0}, (0, 1), (0, 0), sums)
    assert got.schema.field("s").type == pa.string()
    assert got.column("s").to_pylist() == ["a", None, None]


def test_missing_file_names_the_producer_attempt(storage):
    ref = PartitionRef("p", 0, 2)
    written = write_partition(storage, JOB, ref, [table(0, 5), table(5, 5)])
    path = subpartition_path(storage, JOB, ref, 1)
    os.remove(path)
    with pytest.raises(PartitionMissing) as info:
        read_subpartitions(storage, JOB, "p", {0: 2}, (0, 0), (0, 1), checksums_of(written, 0))
    assert info.value.partition == ref
    assert path in str(info.value)


def test_a_released_partition_is_missing(storage):
    ref = PartitionRef("p", 0, 0)
    written = write_partition(storage, JOB, ref, [table(0, 5)])
    release_partition(storage, JOB, ref)
    with pytest.raises(PartitionMissing):
        read_subpartitions(storage, JOB, "p", {0: 0}, (0, 0), (0, 0), checksums_of(written, 0))


def test_changed_bytes_are_corrupt(storage):
    ref = PartitionRef("p", 0, 0)
    written = write_partition(storage, JOB, ref, [table(0, 50)])
    path = subpartition_path(storage, JOB, ref, 0)
    with open(path, "r+b") as f:
        f.seek(40)
        byte = f.read(1)
        f.seek(40)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(PartitionCorrupt) as info:
        read_subpartitions(storage, JOB, "p", {0: 0}, (0, 0), (0, 0), checksums_of(written, 0))
    assert info.value.partition == ref
    assert path in str(info.value) and "checksum" in str(info.value)


def test_a_file_that_is_not_arrow_is_corrupt_even_with_its_own_checksum(storage):
    from tailguard.agent.executor.partitions import checksum

    ref = PartitionRef("p", 0, 0)
    write_partition(storage, JOB, ref, [table(0, 5)])
    path = subpartition_path(storage, JOB, ref, 0)
    with open(path, "wb") as f:
        f.write(b"not arrow at all")
    with pytest.raises(PartitionCorrupt, match="unreadable"):
        read_subpartitions(
            storage, JOB, "p", {0: 0}, (0, 0), (0, 0), {(0, 0): checksum(b"not arrow at all")}
        )


def test_no_temporaries_are_left_behind(storage, tmp_path):
    write_partition(storage, JOB, PartitionRef("p", 0, 0), [table(0, 5)] * 3)
    names = os.listdir(tmp_path / JOB / "partitions" / "p" / "0" / "0")
    assert not [n for n in names if n.startswith(".")]


def test_sweep_job_removes_the_whole_tree_and_the_marker(storage, tmp_path):
    mark_job_running(storage, JOB, JobOwner.current())
    write_partition(storage, JOB, PartitionRef("p", 0, 0), [table(0, 5)])
    write_partition(storage, "other", PartitionRef("p", 0, 0), [table(0, 5)])
    sweep_job(storage, JOB)
    assert sorted(os.listdir(tmp_path)) == ["other"]


def test_marker_round_trips(storage):
    owner = JobOwner("host-a", 1234, 1_700_000_000_000)
    mark_job_running(storage, JOB, owner)
    assert read_job_owner(storage, JOB) == owner
    assert read_job_owner(storage, "unknown") is None


def test_sweep_abandoned_removes_only_jobs_of_dead_owners(storage, tmp_path):
    alive = JobOwner("h", 1, 0)
    dead = JobOwner("h", 2, 0)
    mark_job_running(storage, "job-alive", alive)
    mark_job_running(storage, "job-dead", dead)
    write_partition(storage, "job-dead", PartitionRef("p", 0, 0), [table(0, 5)])
    write_partition(storage, "no-marker", PartitionRef("p", 0, 0), [table(0, 5)])
    asked: list[JobOwner] = []

    def is_alive(owner: JobOwner) -> bool:
        asked.append(owner)
        return owner.pid == 1

    assert sweep_abandoned(storage, is_alive) == ["job-dead"]
    assert sorted(os.listdir(tmp_path)) == ["job-alive", "no-marker"]
    assert sorted(o.pid for o in asked) == [1, 2]


def test_local_liveness_check_of_real_processes():
    import subprocess
    import sys

    me = JobOwner.current()
    assert local_owner_alive(me)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    # The child has been reaped: its pid no longer exists (reuse within this test is negligible).
    assert not local_owner_alive(JobOwner(me.host, child.pid, me.started_ms))
    # A live pid that started after the job's marker is a reused pid: the owner is dead.
    assert not local_owner_alive(JobOwner(me.host, os.getpid(), 0))
    # Another host's owner cannot be judged from here: kept.
    assert local_owner_alive(JobOwner("elsewhere.example", child.pid, 0))


def test_prepare_job_storage_sweeps_dead_local_jobs_and_marks_this_one(storage, tmp_path):
    import subprocess
    import sys

    me = JobOwner.current()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    mark_job_running(storage, "crashed", JobOwner(me.host, child.pid, me.started_ms))
    mark_job_running(storage, "remote", JobOwner("elsewhere.example", child.pid, 0))
    assert prepare_job_storage(storage, JOB) == ["crashed"]
    assert sorted(os.listdir(tmp_path)) == [JOB, "remote"]
    owner = read_job_owner(storage, JOB)
    assert owner is not None and owner.pid == os.getpid()


def test_each_file_is_read_once_verifying_it_in_the_same_pass(storage, monkeypatch):
    from tailguard.agent.executor import partitions

    read: list[int] = []
    original = partitions._HashingInput.read

    def counting(self, nbytes=-1):
        data = original(self, nbytes)
        read.append(len(data))
        return data

    monkeypatch.setattr(partitions._HashingInput, "read", counting)
    parts = [table(i * 20_000, 20_000) for i in range(4)]
    written = write_partition(storage, JOB, PartitionRef("p", 0, 0), parts)
    got, read_bytes = read_subpartitions(
        storage, JOB, "p", {0: 0}, (0, 0), (0, 3), checksums_of(written, 0)
    )
    assert got.num_rows == 80_000
    files = sum(written.bytes_per_subpartition)
    assert read_bytes == files
    # The file bytes once, plus each file's schema header for unifying schemas up front
    # (a few hundred bytes each), not the file twice as hash-then-read did.
    assert files <= sum(read) <= files + 4 * 1024
