"""Object storage end to end, against a real S3-protocol server started here (moto's standalone
server over HTTP on loopback, not a mock object): a job reads its source from an `s3a://` URI,
exchanges its result partitions through S3, commits its sink to S3, its archive lands in S3, and
`tailguard replay` of that archive reports no differences. The credentials come from the
settings (Flink's `s3.*` keys), so the executors can only have them from their driver; they are
found in no archive, log line or Spark setting.

Also here, without Spark: what a lost driver's remote archive keeps, and that a new writer
continues it; a sink part published to S3 appears whole or not at all.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from tailguard import filesystems
from tailguard.agent.driver.hooks import JobHooks
from tailguard.agent.executor import sinks
from tailguard.agent.executor.sinks import (
    commit_sink_output,
    committed_files,
    finalize_sink,
    prepare_sink,
    stage_sink_output,
)
from tailguard.agent.executor.storage import Storage
from tailguard.archive import PARTS_SUFFIX, ArchiveReader, ArchiveWriter, Direction
from tailguard.examples import sales_by_region
from tailguard.model import records as r
from tailguard.model.config import Settings

moto_server = pytest.importorskip(
    "moto.server", reason="moto[server] is in the dev extra: pip install -e '.[dev]'"
)

ACCESS_KEY = "AKIATAILGUARDTEST"
SECRET_KEY = "s3-secret-that-must-never-be-recorded"
# The sales example runs as two chains.
HEAD = "sales→score→partial"
TAIL = "final→sink"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_settings(s3_endpoint: str) -> Iterator[dict[str, str]]:
    values = {
        "s3.endpoint": s3_endpoint,
        "s3.access-key": ACCESS_KEY,
        "s3.secret-key": SECRET_KEY,
        "s3.path.style.access": "true",
        "s3.endpoint.region": "us-east-1",
    }
    yield values
    filesystems.configure(None)


@pytest.fixture
def bucket(s3_settings: dict[str, str]) -> str:
    name = f"tailguard-{uuid.uuid4().hex[:10]}"
    admin(s3_settings).create_dir(name)
    return name


def admin(s3_settings: dict[str, str]) -> pafs.S3FileSystem:
    """The test's own client (it creates buckets; tailguard's does not)."""
    return pafs.S3FileSystem(
        access_key=ACCESS_KEY,
        secret_key=SECRET_KEY,
        endpoint_override=s3_settings["s3.endpoint"],
        region="us-east-1",
        allow_bucket_creation=True,
    )


def listing(fs: pafs.FileSystem, prefix: str) -> list[str]:
    selector = pafs.FileSelector(prefix, recursive=True, allow_not_found=True)
    return sorted(i.path for i in fs.get_file_info(selector) if i.type == pafs.FileType.File)


# ---------------------------------------------------------------------- the archive alone


def envelopes(writer: ArchiveWriter, start: int, n: int) -> None:
    for i in range(start, start + n):
        tick = r.Tick(job_id="job-1", ts=i, id=f"record {i}")
        writer.append("tailguard.events", Direction.PUBLISHED, tick, i)


def payloads(location: str) -> list[bytes]:
    """What the archive holds, as the ids `envelopes` gave the records."""
    return [e.record.id.encode() for e in ArchiveReader(location)]


def test_a_lost_driver_keeps_its_archive_up_to_the_last_upload(
    s3_settings: dict[str, str], bucket: str, tmp_path: Path
) -> None:
    filesystems.configure_from(s3_settings)
    location = f"s3a://{bucket}/archive/job-1.avro"
    spool = tmp_path / "spool"
    # An interval no test reaches: only `sync` uploads, so what the remote holds is known.
    writer = ArchiveWriter(location, flush_every=10, upload_interval_s=3600, spool_dir=spool)
    assert payloads(location) == []  # the header went up at once
    envelopes(writer, 0, 20)
    writer.sync()
    envelopes(writer, 20, 7)
    writer.flush()  # on the driver's disk, not yet uploaded
    # The driver's container is lost here: no close, the spool goes with it.
    lost_spool = next(spool.iterdir())
    fs = admin(s3_settings)
    assert listing(fs, f"{bucket}/archive/job-1.avro{PARTS_SUFFIX}")  # parts, no whole object
    assert fs.get_file_info(f"{bucket}/archive/job-1.avro").type == pafs.FileType.NotFound
    assert payloads(location) == [f"record {i}".encode() for i in range(20)]

    # A writer that continues the archive (same job id) starts from what the remote holds.
    lost_spool.unlink()
    with ArchiveWriter(location, flush_every=10, upload_interval_s=3600, spool_dir=spool) as again:
        envelopes(again, 100, 5)
    assert payloads(f"s3://{bucket}/archive/job-1.avro") == [
        f"record {i}".encode() for i in [*range(20), *range(100, 105)]
    ]
    # Closed: one whole object, no parts, no spool.
    assert listing(fs, f"{bucket}/archive") == [f"{bucket}/archive/job-1.avro"]
    assert list(spool.iterdir()) == []


def test_background_uploads_follow_the_writer(
    s3_settings: dict[str, str], bucket: str, tmp_path: Path
) -> None:
    filesystems.configure_from(s3_settings)
    location = f"s3://{bucket}/a.avro"
    with ArchiveWriter(location, flush_every=5, upload_interval_s=0, spool_dir=tmp_path) as w:
        envelopes(w, 0, 50)
        seen = payloads(location)  # whatever the background uploads have sent so far
        assert seen == [f"record {i}".encode() for i in range(len(seen))]
    assert payloads(location) == [f"record {i}".encode() for i in range(50)]


# ---------------------------------------------------------------------- sink commits on S3


class FailingReader:
    """A staged file whose read fails after its first chunk (a lost disk, a network error)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.reads = 0

    def __enter__(self) -> FailingReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.inner.close()

    def read(self, n: int) -> bytes:
        self.reads += 1
        if self.reads > 1:
            raise OSError("the staged file became unreadable")
        return bytes(self.inner.read(n))


def test_a_part_published_to_s3_appears_whole_or_not_at_all(
    s3_settings: dict[str, str], bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    filesystems.configure_from(s3_settings)
    fs = admin(s3_settings)
    staging = Storage(str(tmp_path / "store"))  # the usual cluster case: staged elsewhere
    sink = f"s3a://{bucket}/out"
    prepare_sink(sink)
    table = pa.table({"i": list(range(5_000)), "s": [f"row {i}" for i in range(5_000)]})
    staged = stage_sink_output(staging, "job-1", "sink", 0, 0, table)

    # The copy to S3 fails half-way: closing the upload would publish a truncated part.
    monkeypatch.setattr(sinks, "_COPY_CHUNK_BYTES", 1024)
    real_open = Storage.open_input
    monkeypatch.setattr(
        Storage, "open_input", lambda self, path: FailingReader(real_open(self, path))
    )
    with pytest.raises(OSError, match="became unreadable"):
        commit_sink_output(staging, staged, sink)
    assert fs.get_file_info(f"{bucket}/out/part-00000.parquet").type == pafs.FileType.NotFound
    monkeypatch.setattr(Storage, "open_input", real_open)

    commit_sink_output(staging, staged, sink)
    # On the same store, a part over CopyObject's limit is streamed instead of copied.
    on_s3 = Storage(f"s3://{bucket}/storage")
    monkeypatch.setattr(sinks, "_SERVER_SIDE_COPY_MAX_BYTES", 0)
    big = stage_sink_output(on_s3, "job-1", "sink", 1, 3, table)
    commit_sink_output(on_s3, big, sink)
    assert not on_s3.exists(big.path)
    finalize_sink(sink)
    assert committed_files(sink) == {
        "part-00000.parquet": staged.bytes,
        "part-00001.parquet": big.bytes,
    }
    for name in ("part-00000.parquet", "part-00001.parquet"):
        assert pq.read_table(f"{bucket}/out/{name}", filesystem=fs).equals(table)


# ---------------------------------------------------------------------- a job on S3


@pytest.mark.spark
def test_job_reads_exchanges_commits_and_archives_on_s3(
    tailguard_local_spark: Any,
    s3_settings: dict[str, str],
    bucket: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tailguard.agent.entry import run as run_job
    from tailguard.cli import main as tailguard_cli

    fs = admin(s3_settings)
    local_data = sales_by_region.generate(tmp_path / "sales", files=4, rows_per_file=3_000)
    pafs.copy_files(str(local_data), f"{bucket}/input/sales", destination_filesystem=fs)
    settings = Settings(
        {
            "execution.batch.adaptive.auto-parallelism.avg-data-volume-per-task": "64 KiB",
            "execution.batch.adaptive.auto-parallelism.max-parallelism": "8",
            "tailguard.work-dir": str(tmp_path / "work"),
            "tailguard.archive-dir": f"s3a://{bucket}/archive",
            "tailguard.archive.upload-interval": "200 ms",
            **s3_settings,
        }
    )
    storage = f"s3a://{bucket}/storage"
    sink = f"s3a://{bucket}/out/sales"
    exchanged: set[str] = set()

    def partitions_on_s3(event: r.Event) -> None:
        if isinstance(event, r.AttemptFinished) and event.vertex == HEAD:
            root = f"{bucket}/storage/{event.job_id}/partitions"
            exchanged.update(i.base_name for i in fs.get_file_info(pafs.FileSelector(root)))

    caplog.set_level("DEBUG")
    result = run_job(
        sales_by_region.make_job(f"s3a://{bucket}/input/sales", sink),
        tailguard_local_spark,
        log_mode="archive",
        services=False,
        settings=settings,
        storage=storage,
        progress=False,
        hooks=JobHooks(on_event=partitions_on_s3),
    )
    assert result.ok, result.summary()

    # The exchange went through S3, and the job's tree there is gone once it ended.
    assert exchanged == {HEAD}
    assert listing(fs, f"{bucket}/storage/{result.job_id}") == []

    # The sink: exactly the committed files, named by the manifest, hold the exact result.
    manifest = committed_files(sink)
    assert manifest is not None and len(manifest) == result.parallelism[TAIL][0]
    parts = {p.rsplit("/", 1)[1]: p for p in listing(fs, f"{bucket}/out/sales")}
    assert {n for n in parts if n.startswith("part-")} == set(manifest)
    assert all(fs.get_file_info(parts[n]).size == size for n, size in manifest.items())
    table = pq.read_table([parts[n] for n in sorted(manifest)], filesystem=fs)
    actual = table.to_pandas().sort_values("region").reset_index(drop=True)
    expected = sales_by_region.reference(local_data)
    assert actual[expected.columns.tolist()].equals(expected)

    # The archive is one object in S3 (scheme kept, s3a mapped), with no parts or spool left.
    assert result.archive == f"s3://{bucket}/archive/{result.job_id}.avro"
    assert listing(fs, f"{bucket}/archive") == [f"{bucket}/archive/{result.job_id}.avro"]
    assert list((tmp_path / "work" / "archive-spool").iterdir()) == []

    # `tailguard replay` reads it from S3 (the settings file gives it the credentials).
    config = tmp_path / "tailguard.toml"
    config.write_text("".join(f'"{k}" = "{v}"\n' for k, v in s3_settings.items()))
    monkeypatch.setenv("TAILGUARD_CONFIG", str(config))
    filesystems.configure(None)
    capsys.readouterr()
    assert tailguard_cli(["replay", f"s3a://{bucket}/archive/{result.job_id}.avro"]) == 0
    replayed = capsys.readouterr().out
    assert "replayed" in replayed and "decider" in replayed, replayed

    # The credentials are in no archive, log line or Spark setting.
    with fs.open_input_stream(f"{bucket}/archive/{result.job_id}.avro") as handle:
        archived = handle.read()
    carriers = [
        record
        for record in (
            e.record for e in ArchiveReader(f"s3://{bucket}/archive/{result.job_id}.avro")
        )
        if SECRET_KEY in repr(record) or ACCESS_KEY in repr(record)
    ]
    assert carriers == []
    assert SECRET_KEY.encode() not in archived and ACCESS_KEY.encode() not in archived
    assert SECRET_KEY not in caplog.text and ACCESS_KEY not in caplog.text
    conf = dict(tailguard_local_spark.sparkContext.getConf().getAll())
    assert not [k for k, v in conf.items() if SECRET_KEY in v or ACCESS_KEY in v]
