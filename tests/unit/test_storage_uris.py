"""Storage locations: scheme mapping, relative paths, bad URIs, S3 settings, the scheme kept.

`mock://` is pyarrow's in-memory filesystem: a non-local scheme that needs no server, so the
scheme's way through sources, storage, sinks and the archive is checked here; the same against a
real S3-protocol server is tests/integration/test_s3.py.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tailguard import filesystems
from tailguard.agent.executor.sinks import (
    commit_sink_output,
    committed_files,
    finalize_sink,
    prepare_sink,
    stage_sink_output,
)
from tailguard.agent.executor.sources import SourceDef, SourceError, discover_splits, read_splits
from tailguard.agent.executor.storage import Storage
from tailguard.archive import ArchiveError, ArchiveReader, ArchiveWriter, Direction
from tailguard.filesystems import LocationError, S3Options, normalise
from tailguard.model.config import ConfigError
from tailguard.model.records import Tick

SECRET = "wJalrXUtnFEMI-not-a-real-secret"


@pytest.fixture(autouse=True)
def no_s3_options() -> Iterator[None]:
    filesystems.configure(None)
    yield
    filesystems.configure(None)


# ---------------------------------------------------------------------- normalising


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("s3://bucket/data/", "s3://bucket/data"),
        ("s3a://bucket/data", "s3://bucket/data"),
        ("S3A://bucket/data", "s3://bucket/data"),
        ("s3n://bucket/a/b.parquet", "s3://bucket/a/b.parquet"),
        ("s3://bucket", "s3://bucket"),
        ("gs://bucket/x", "gs://bucket/x"),
        ("hdfs://namenode:8020/user/x", "hdfs://namenode:8020/user/x"),
        ("abfs://container@account.dfs.core.windows.net/x", None),
        ("s3://bucket/x?region=eu-west-1", "s3://bucket/x?region=eu-west-1"),
    ],
)
def test_uris_keep_their_scheme_and_hadoop_names_map_to_s3(given: str, expected: str | None):
    assert normalise(given) == (expected or given)


def test_relative_and_file_locations_become_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert normalise("data/in") == str(tmp_path / "data" / "in")
    assert normalise(Path("data")) == str(tmp_path / "data")
    assert normalise(f"file://{tmp_path}/x") == str(tmp_path / "x")
    assert normalise(f"file:{tmp_path}/x") == str(tmp_path / "x")
    assert normalise("file:///tmp/a%20b") == "/tmp/a b"
    assert filesystems.is_local(normalise("data")) and not filesystems.is_local("s3://b/k")


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("", "empty storage location"),
        ("   ", "empty storage location"),
        ("s3:/bucket/key", "lost a slash"),
        ("s3a:/bucket/key", "lost a slash"),
        ("s3:///key", "names no bucket"),
        ("s3a://", "names no bucket"),
        ("file://otherhost/x", "names no host"),
        ("s3://bucket/x#frag", "fragment"),
    ],
)
def test_bad_locations_are_refused_naming_them(given: str, message: str):
    with pytest.raises(LocationError, match=message) as err:
        normalise(given)
    assert given.strip() in str(err.value) or not given.strip()


@pytest.mark.parametrize(
    "given",
    [
        f"s3://AKIAEXAMPLE:{SECRET}@bucket/x",
        f"s3a://AKIAEXAMPLE:{SECRET}@bucket/x",
        "s3://AKIAEXAMPLE@bucket/x",
        f"gs://user:{SECRET}@bucket/x",
        f"hdfs://user:{SECRET}@namenode:8020/x",
        f"s3:/AKIAEXAMPLE:{SECRET}@bucket/x",  # lost a slash too
        f"s3://AKIAEXAMPLE:{SECRET}@bucket/x#fragment",
    ],
)
def test_credentials_in_a_uri_are_refused_without_repeating_them(given: str):
    with pytest.raises(LocationError) as err:
        normalise(given)
    assert SECRET not in str(err.value) and "AKIAEXAMPLE" not in str(err.value)


def test_a_user_part_that_is_no_credential_is_kept():
    # Azure's container and HDFS's user are not secrets.
    assert normalise("hdfs://alice@namenode:8020/x") == "hdfs://alice@namenode:8020/x"


def test_unknown_schemes_fail_on_open_naming_the_uri():
    with pytest.raises(LocationError, match=r"cannot open storage location nosuch://b/x"):
        filesystems.open_location("nosuch://b/x")
    with pytest.raises(LocationError, match="nosuch://b/x"):
        Storage("nosuch://b/x").fs  # noqa: B018 - opening is the point


def test_join_and_child_location_keep_scheme_and_query():
    assert filesystems.join("s3://b/archive", "job-1.avro") == "s3://b/archive/job-1.avro"
    assert filesystems.join("s3://b/x?region=r", "a", 3) == "s3://b/x/a/3?region=r"
    assert filesystems.join("/data", "a", "b") == "/data/a/b"
    # A name with characters that end a URI path is escaped, and opens back to itself.
    odd = filesystems.join("mock:///d", "a?b#c%d")
    assert odd == "mock:///d/a%3Fb%23c%25d"
    assert filesystems.open_location(odd)[1].endswith("d/a?b#c%d")
    assert filesystems.child_location("s3://b/in", "b/in", "b/in/p=1/f.parquet") == (
        "s3://b/in/p=1/f.parquet"
    )
    with pytest.raises(LocationError):
        filesystems.child_location("s3://b/in", "b/in", "b/other/f")


# ---------------------------------------------------------------------- S3 settings


def s3_settings(**values: str) -> dict[str, str]:
    return {f"s3.{k.replace('_', '-')}": v for k, v in values.items()}


def test_s3_options_from_flinks_keys():
    options = S3Options.from_settings(
        {
            "s3.access-key": "AKIAEXAMPLE",
            "s3.secret-key": SECRET,
            "s3.endpoint": "http://127.0.0.1:9000",
            "s3.path.style.access": "true",
            "s3.endpoint.region": "eu-west-1",
        }
    )
    assert options == S3Options("http://127.0.0.1:9000", "eu-west-1", True, "AKIAEXAMPLE", SECRET)
    assert options is not None and options.credentials == "settings"
    # What may end up in a log line or a traceback shows no credential.
    assert SECRET not in repr(options) and "AKIAEXAMPLE" not in repr(options)
    fs = options.open()
    assert fs.type_name == "s3" and fs.region == "eu-west-1"
    assert S3Options.from_settings({}) is None
    assert S3Options.from_settings({"s3.endpoint.region": "us-east-2"}) == S3Options(
        region="us-east-2"
    )
    assert S3Options(region="r").credentials == "the AWS default chain"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"s3.access-key": "AKIAEXAMPLE"}, "s3.access-key is set but s3.secret-key is not"),
        ({"s3.secret-key": SECRET}, "s3.secret-key is set but s3.access-key is not"),
        ({"s3.path.style.access": "maybe"}, "s3.path.style.access must be true or false"),
    ],
)
def test_bad_s3_settings_name_the_key_and_never_the_secret(values, message):
    with pytest.raises(ConfigError, match=message) as err:
        S3Options.from_settings(values)
    assert SECRET not in str(err.value) and "AKIAEXAMPLE" not in str(err.value)


def test_configuring_other_options_drops_the_opened_filesystems():
    filesystems.configure(S3Options(endpoint="http://127.0.0.1:1", region="us-east-1"))
    fs, inner = filesystems.open_location("s3a://bucket/a/b")
    assert inner == "bucket/a/b" and fs.type_name == "s3"
    assert filesystems.open_location("s3://other/c")[0] is fs  # one client for all buckets
    filesystems.configure(S3Options(endpoint="http://127.0.0.1:2", region="us-east-1"))
    assert filesystems.open_location("s3://bucket/a")[0] is not fs
    assert filesystems.configured_s3() == S3Options(
        endpoint="http://127.0.0.1:2", region="us-east-1"
    )


def test_a_pickled_s3_storage_carries_no_credentials():
    filesystems.configure(
        S3Options(
            endpoint="http://127.0.0.1:1", region="us-east-1", access_key="AK", secret_key=SECRET
        )
    )
    storage = Storage("s3a://bucket/root")
    assert storage.root == "bucket/root" and storage.object_store
    payload = pickle.dumps(storage)
    assert SECRET.encode() not in payload and b"127.0.0.1" not in payload
    assert pickle.loads(payload).uri == "s3://bucket/root"
    assert SECRET not in repr(storage)


# ---------------------------------------------------------------------- the scheme kept


def test_sources_keep_the_scheme_of_every_split():
    fs, root = filesystems.open_location("mock:///in")
    table = pa.table({"x": list(range(10))})
    for name in ("b.parquet", "a.parquet", "sub/c.parquet", "skip.txt"):
        fs.create_dir(f"{root}/sub", recursive=True)
        with fs.open_output_stream(f"{root}/{name}") as out:
            pq.write_table(table, out, row_group_size=5)
    splits = discover_splits(SourceDef("parquet", ("mock:///in",)))
    assert [(s.path, s.row_group) for s in splits] == [
        ("mock:///in/a.parquet", 0),
        ("mock:///in/a.parquet", 1),
        ("mock:///in/b.parquet", 0),
        ("mock:///in/b.parquet", 1),
        ("mock:///in/sub/c.parquet", 0),
        ("mock:///in/sub/c.parquet", 1),
    ]
    assert read_splits(SourceDef("parquet", ("mock:///in",)), splits).num_rows == 30


def test_a_relative_source_path_is_made_absolute_in_the_driver(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "in" / "f.parquet")
    splits = discover_splits(SourceDef("parquet", ("in",)))
    assert [s.path for s in splits] == [str(tmp_path / "in" / "f.parquet")]
    monkeypatch.chdir("/")  # an executor's working directory is not the driver's
    assert read_splits(SourceDef("parquet", ("in",)), splits).num_rows == 2


def test_bad_source_locations_name_the_location(tmp_path):
    with pytest.raises(SourceError, match="source path not found: mock:///nothing"):
        discover_splits(SourceDef("parquet", ("mock:///nothing",)))
    with pytest.raises(SourceError, match="lost a slash"):
        discover_splits(SourceDef("parquet", ("s3a:/bucket/in",)))
    with pytest.raises(SourceError, match="nosuch://b/in"):
        discover_splits(SourceDef("parquet", ("nosuch://b/in",)))


def test_sink_commit_on_another_scheme_writes_a_manifest(tmp_path):
    storage = Storage(str(tmp_path / "store"))
    sink = "mock:///out/sales"
    prepare_sink(sink)
    assert committed_files(sink) is None
    table = pa.table({"x": list(range(100))})
    staged = [stage_sink_output(storage, "job-1", "sink", i, 0, table) for i in range(2)]
    for s in staged:
        commit_sink_output(storage, s, sink)
    finalize_sink(sink)
    assert committed_files(sink) == {
        "part-00000.parquet": staged[0].bytes,
        "part-00001.parquet": staged[1].bytes,
    }


def test_archive_on_another_scheme_round_trips(tmp_path):
    location = "mock:///archive/job-1.avro"
    with ArchiveWriter(location, spool_dir=tmp_path, upload_interval_s=0) as writer:
        for i in range(30):
            writer.append("t", Direction.PUBLISHED, Tick(job_id="job-1", ts=i, id=f"r{i}"), i)
    assert [e.record.id for e in ArchiveReader("mock:///archive/job-1.avro")] == [
        f"r{i}" for i in range(30)
    ]
    assert list(tmp_path.iterdir()) == []  # the spool is gone once uploaded whole
    with pytest.raises(ArchiveError, match=r"no archive at mock:///archive/other\.avro"):
        ArchiveReader("mock:///archive/other.avro")
    with pytest.raises(ArchiveError, match="lost a slash"):
        ArchiveReader("s3:/bucket/a.avro")


def test_an_unreachable_archive_location_fails_at_once_naming_it(tmp_path):
    filesystems.configure(S3Options(endpoint="http://127.0.0.1:1", region="us-east-1"))
    with pytest.raises(ArchiveError, match=r"cannot reach the archive at s3://bucket/a\.avro"):
        ArchiveWriter("s3a://bucket/a.avro", spool_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []
