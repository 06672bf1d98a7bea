"""Storage root over pyarrow.fs: paths, atomic writes, moves, listing, pickling."""

import os
import pickle

import pytest

from tailguard.agent.executor.storage import Storage


def test_relative_local_root_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    storage = Storage("data")
    assert storage.uri == str(tmp_path / "data")
    assert storage.path("a", 1, "b.arrow") == f"{tmp_path}/data/a/1/b.arrow"


def test_file_uri_reaches_the_same_tree_as_the_path(tmp_path):
    by_path = Storage(str(tmp_path))
    by_uri = Storage(f"file://{tmp_path}")
    by_path.write_atomic(by_path.path("x", "f"), b"hello")
    assert bytes(by_uri.read_bytes(by_uri.path("x", "f"))) == b"hello"
    assert by_uri.same_filesystem(by_path)


def test_pickle_carries_only_the_uri_and_reopens_lazily(tmp_path):
    storage = Storage(str(tmp_path))
    storage.write_atomic(storage.path("f"), b"1")  # opens the filesystem
    payload = pickle.dumps(storage)
    assert len(payload) < 200
    clone = pickle.loads(payload)
    assert clone == storage and hash(clone) == hash(storage)
    assert clone.exists(clone.path("f"))


def test_open_output_creates_parents_and_open_input_reads_back(tmp_path):
    storage = Storage(str(tmp_path))
    path = storage.path("deep", "er", "file.bin")
    with storage.open_output(path) as out:
        out.write(b"abc")
    with storage.open_input(path) as f:
        assert f.read() == b"abc"
    assert storage.size(path) == 3
    assert storage.size(storage.path("nope")) is None


def test_write_atomic_leaves_no_temporary_behind(tmp_path):
    storage = Storage(str(tmp_path))
    storage.write_atomic(storage.path("d", "f"), b"x" * 1000)
    storage.write_atomic(storage.path("d", "f"), b"y")
    assert storage.list_dir(storage.path("d")) == ["f"]
    assert bytes(storage.read_bytes(storage.path("d", "f"))) == b"y"


def test_move_replaces_the_destination(tmp_path):
    storage = Storage(str(tmp_path))
    storage.write_atomic(storage.path("a"), b"new")
    storage.write_atomic(storage.path("out", "b"), b"old")
    storage.move(storage.path("a"), storage.path("out", "b"))
    assert not storage.exists(storage.path("a"))
    assert bytes(storage.read_bytes(storage.path("out", "b"))) == b"new"


def test_move_creates_the_destination_directory(tmp_path):
    storage = Storage(str(tmp_path))
    storage.write_atomic(storage.path("a"), b"1")
    storage.move(storage.path("a"), storage.path("new", "dir", "a"))
    assert storage.exists(storage.path("new", "dir", "a"))


def test_deleting_missing_things_is_fine_and_list_of_missing_dir_is_empty(tmp_path):
    storage = Storage(str(tmp_path))
    storage.delete_dir(storage.path("nope"))
    storage.delete_file(storage.path("nope"))
    assert storage.list_dir(storage.path("nope")) == []
    storage.write_atomic(storage.path("t", "x", "f"), b"1")
    storage.write_atomic(storage.path("t", "g"), b"1")
    assert storage.list_dir(storage.path("t")) == ["g", "x"]
    storage.delete_dir(storage.path("t"))
    assert not os.path.exists(tmp_path / "t")


def test_a_failed_write_leaves_no_temporary(tmp_path):
    storage = Storage(str(tmp_path))
    # The final rename fails: the destination is a non-empty directory.
    storage.write_atomic(storage.path("d", "f", "inside"), b"1")
    with pytest.raises(OSError):
        storage.write_atomic(storage.path("d", "f"), b"2")
    assert storage.list_dir(storage.path("d")) == ["f"]
    assert storage.list_dir(storage.path("d", "f")) == ["inside"]
