"""The archive: one Avro object container file per job, the durable audit log.

Every record the agent publishes or receives (and decisions it takes locally while the services
are unreachable) is appended as a typed entry (`archive_entries`): the record itself, in a union
of every record schema, with the topic it travelled on, when and how it was archived. So the file
is a standard Avro object container file whose records any Avro tool reads as records, not as
opaque bytes. Archives of the older format (each record's encoded bytes) are read too.

The writer flushes a block every `flush_every` records, on `flush()` and on `close()`, so a
reader sees records while the writer still runs. A reader stops quietly at an incomplete final
block (one still being written); a damaged block before the end is an error.

An archive can live at any `pyarrow.fs` URI (`s3://bucket/archive/job.avro`), so it survives a
driver container. S3 and most object stores cannot append, so the writer writes a local spool
file and keeps a remote copy (`_RemoteCopy`): every upload interval the bytes flushed since the
last upload go up as one part object, `<archive>.parts/<byte offset>`, and at close the whole
file is uploaded as `<archive>` and the parts are deleted. A reader joins `<archive>` (if any)
and the parts after it, so a crashed driver's archive is readable up to its last part: a lost
driver loses at most the records of its last upload interval (plus those not yet flushed). The
Kafka topics remain the complete log (`tailguard replay --topic`).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import tempfile
import threading
import time
import uuid
import zlib
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

import fastavro
import pyarrow.fs as pafs
from fastavro.write import Writer

from tailguard import filesystems
from tailguard.log.archive_entries import (
    ArchiveError,
    Direction,
    EntryDecoder,
    EntryEncoder,
    Envelope,
    current_entry_schema,
    decoder_for,
    is_current,
    read_block,
)
from tailguard.log.codec_api import Codec
from tailguard.model.config import Settings
from tailguard.model.records import Record

__all__ = [
    "ArchiveError",
    "ArchiveReader",
    "ArchiveWriter",
    "Direction",
    "Envelope",
    "open_archive",
]

log = logging.getLogger(__name__)

# The remote copy's upload interval unless told otherwise: what a lost driver can lose at most.
DEFAULT_UPLOAD_INTERVAL_S = 10.0
PARTS_SUFFIX = ".parts"


_MAGIC = b"Obj\x01"
_SYNC_SIZE = 16
_HEADER_SCHEMA = fastavro.parse_schema(
    {
        "type": "record",
        "name": "org.apache.avro.file.Header",
        "fields": [
            {"name": "magic", "type": {"type": "fixed", "name": "Magic", "size": 4}},
            {"name": "meta", "type": {"type": "map", "values": "bytes"}},
            {"name": "sync", "type": {"type": "fixed", "name": "Sync", "size": _SYNC_SIZE}},
        ],
    }
)


class ArchiveWriter:
    """Appends typed entries to the archive at `location` (created, or continued if it exists
    and was written with today's schemas): a local path, or a `pyarrow.fs` URI kept as a remote
    copy of a local spool file (module docstring), uploaded every `upload_interval_s` and at
    close."""

    def __init__(
        self,
        location: str | Path,
        *,
        flush_every: int = 100,
        codec: str = "null",
        upload_interval_s: float = DEFAULT_UPLOAD_INTERVAL_S,
        spool_dir: str | Path | None = None,
    ) -> None:
        self.location = _location(location)
        self.flush_every = flush_every
        self._remote: _RemoteCopy | None = None
        if filesystems.is_local(self.location):
            self.path = Path(self.location)
            self.path.parent.mkdir(parents=True, exist_ok=True)
        else:
            self._remote = _RemoteCopy(self.location, upload_interval_s)
            self.path = self._remote.start(spool_dir)
        existing = self.path.exists() and self.path.stat().st_size > 0
        if existing and self._remote is None:
            # Checked before fastavro appends to it, for a clear error on a foreign file.
            reader = ArchiveReader(self.path)
            reader.check_continuable()
            _drop_torn_tail(self.path, reader.complete_length())
        self._entries = EntryEncoder()
        self._file: IO[bytes] = self.path.open("a+b" if existing else "wb")
        try:
            self._writer = Writer(self._file, current_entry_schema(), codec=codec)
            # The header goes out now, so a reader can open the archive before the first flush
            # (remote: uploaded at once, which also proves the location is writable).
            self._file.flush()
            if self._remote is not None:
                self._remote.upload(self.path, self._file.tell(), wait=True)
        except Exception:
            self._file.close()
            if self._remote is not None:
                self._remote.abandon(self.path)
            raise
        self._unflushed = 0

    def append(self, topic: str, direction: Direction | str, record: Record, ts: int) -> None:
        """Archive `record` as it travelled on `topic`; `ts` is when (ms since the epoch)."""
        self._writer.write(self._entries.datum(topic, direction, record, ts))
        self._unflushed += 1
        if self._unflushed >= self.flush_every or (self._remote is not None and self._remote.due()):
            self.flush()

    def flush(self) -> None:
        """Write the pending records as one block and hand it to the OS (local readers see it;
        a remote copy gets it with its next upload, started here when one is due)."""
        self._writer.flush()
        self._file.flush()
        self._unflushed = 0
        if self._remote is not None and self._remote.due():
            self._remote.upload(self.path, self._file.tell())

    def sync(self) -> None:
        """Flush, and upload what is flushed to a remote archive before returning: what a
        reader of the location sees from now on, even if this process dies."""
        self.flush()
        if self._remote is not None:
            self._remote.upload(self.path, self._file.tell(), wait=True)

    def close(self) -> None:
        """Flush and close; a remote archive is then uploaded whole (ArchiveError if that
        fails, naming the local spool file that still holds every record)."""
        if self._file.closed:
            return
        try:
            self.flush()
        finally:
            self._file.close()
        if self._remote is not None:
            self._remote.finish(self.path)

    def __enter__(self) -> ArchiveWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _RemoteCopy:
    """The remote side of an archive at a URI: parts while it grows, one object at the end."""

    def __init__(self, location: str, interval_s: float) -> None:
        self.location = location
        try:
            self.fs, self.inner = filesystems.open_location(location)
        except filesystems.LocationError as err:
            raise ArchiveError(str(err)) from None
        self.interval_s = interval_s
        self._uploaded = 0  # bytes of the spool file the remote copy holds
        self._last_upload = time.monotonic()
        self._uploads = ThreadPoolExecutor(1, thread_name_prefix="tg-archive-upload")
        self._pending: Future[None] | None = None
        self._lock = threading.Lock()

    def start(self, spool_dir: str | Path | None) -> Path:
        """The spool file, holding the remote archive if there is one (which the writer then
        continues), normalised to one object so that new parts follow it."""
        directory = Path(spool_dir or Path(tempfile.gettempdir()) / "tailguard-archive-spool")
        directory.mkdir(parents=True, exist_ok=True)
        name = self.inner.rsplit("/", 1)[-1]
        spool = directory / f"{name}.{uuid.uuid4().hex[:12]}.spool"
        try:
            existing = _remote_bytes(self.fs, self.inner, self.location) or b""
        except OSError as err:
            self.abandon(spool)
            raise ArchiveError(f"cannot reach the archive at {self.location}: {err}") from None
        spool.write_bytes(existing)
        if existing:
            try:
                ArchiveReader(spool).check_continuable()  # before anything is written there
            except ArchiveError as err:
                self.abandon(spool)
                raise ArchiveError(f"{self.location} holds no tailguard archive: {err}") from None
            filesystems.put(self.fs, self.inner, existing)
            _delete_parts(self.fs, self.inner)
            self._uploaded = len(existing)
        return spool

    def due(self) -> bool:
        return time.monotonic() - self._last_upload >= self.interval_s

    def upload(self, spool: Path, end: int, *, wait: bool = False) -> None:
        """Send the spool's bytes up to `end` as a part, in the background unless `wait`; an
        upload still running is not queued behind (the next one catches up)."""
        with self._lock:
            if self._pending is not None and not self._pending.done():
                if not wait:
                    return
                self._pending.result()
            self._last_upload = time.monotonic()
            self._pending = self._uploads.submit(self._upload_part, spool, end, wait)
            pending = self._pending
        if wait:
            pending.result()

    def abandon(self, spool: Path) -> None:
        """Give up a copy that never started (the location is not writable): what the spool
        holds is the header, or what the location already holds."""
        self._uploads.shutdown()
        spool.unlink(missing_ok=True)

    def _upload_part(self, spool: Path, end: int, must: bool) -> None:
        start = self._uploaded
        if end <= start:
            return
        with spool.open("rb") as handle:
            handle.seek(start)
            data = handle.read(end - start)
        try:
            filesystems.put(self.fs, f"{self.inner}{PARTS_SUFFIX}/{start:020d}", data)
        except OSError as err:
            if must:
                raise ArchiveError(f"cannot write the archive at {self.location}: {err}") from None
            # Kept for the next upload, which starts from the same offset.
            log.warning(
                "archive %s: upload of bytes %d-%d failed, retried with the next: %s",
                self.location,
                start,
                end,
                err,
            )
            return
        self._uploaded = end

    def finish(self, spool: Path) -> None:
        with self._lock:
            pending = self._pending
        if pending is not None:
            pending.result()
        self._uploads.shutdown()
        try:
            filesystems.put(self.fs, self.inner, spool.read_bytes())
        except OSError as err:
            raise ArchiveError(
                f"cannot upload the archive to {self.location} ({err}); every record is in "
                f"{spool}, and the parts uploaded so far are under {self.location}{PARTS_SUFFIX}"
            ) from None
        _delete_parts(self.fs, self.inner)
        spool.unlink()


class _PartVanished(Exception):
    """A part listed a moment ago is gone: its writer closed meanwhile (read again)."""


def _delete_parts(fs: pafs.FileSystem, inner: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        fs.delete_dir(f"{inner}{PARTS_SUFFIX}")


def _remote_bytes(fs: pafs.FileSystem, inner: str, location: str) -> bytes | None:
    """The archive at a URI: its object followed by the parts uploaded after it; None when
    there is neither."""
    for _ in range(3):
        try:
            return _join_parts(fs, inner, location)
        except _PartVanished:
            continue
    raise ArchiveError(f"{location}: its parts keep vanishing while read (a writer is closing)")


def _join_parts(fs: pafs.FileSystem, inner: str, location: str) -> bytes | None:
    # Parts are listed before the object is read: a writer that closes in between has
    # uploaded the object whole first, so the parts then listed are all inside it.
    selector = pafs.FileSelector(f"{inner}{PARTS_SUFFIX}", allow_not_found=True)
    parts = sorted(
        (int(info.base_name), info.path)
        for info in fs.get_file_info(selector)
        if info.type == pafs.FileType.File and info.base_name.isdigit()
    )
    try:
        with fs.open_input_stream(inner) as handle:
            data = bytearray(handle.read())
    except FileNotFoundError:
        if not parts:
            return None
        data = bytearray()
    for offset, path in parts:
        if offset > len(data):
            raise ArchiveError(
                f"{location}: bytes {len(data)} to {offset} are missing (before part {path})"
            )
        try:
            with fs.open_input_stream(path) as handle:
                part = handle.read()
        except FileNotFoundError:
            raise _PartVanished(path) from None
        data.extend(part[len(data) - offset :])
    return bytes(data)


def _location(location: str | Path) -> str:
    try:
        return filesystems.normalise(location)
    except filesystems.LocationError as err:
        raise ArchiveError(str(err)) from None


class ArchiveReader:
    """Iterates the entries of an archive (a local path or a URI) in the order they were
    appended, each with its record.

    Each iteration reads the archive afresh, up to its last complete block, so iterating again
    picks up what a running writer has flushed (locally) or uploaded (remotely) since.

    Archives of the older format hold encoded records: `legacy_codec` decodes them (default: the
    embedded default, single-object encoding; one written through a schema registry needs
    `codec_for(settings)`). A record that does not decode, or whose type this version does not
    know, raises ArchiveError naming the entry.
    """

    def __init__(self, location: str | Path, legacy_codec: Codec | None = None) -> None:
        self.location = _location(location)
        self._legacy_codec = legacy_codec
        with self._open() as handle:
            self._schema = self._read_header(handle)[0]

    def check_continuable(self) -> None:
        """ArchiveError unless today's writer can append to this archive (same entry schema)."""
        if not is_current(self._schema):
            raise ArchiveError(
                f"{self.location} was written by another version of tailguard (with other "
                "record schemas): appending to it would mix two formats; write a new archive"
            )

    def complete_length(self) -> int:
        """The bytes up to the end of the last complete block: where a writer may go on."""
        with self._open() as handle:
            _, _, _, sync = self._read_header(handle)
            end = handle.tell()
            for _ in self._blocks(handle, sync):
                end = handle.tell()
            return end

    def _open(self) -> IO[bytes]:
        if filesystems.is_local(self.location):
            path = Path(self.location)
            if not path.is_file():
                raise ArchiveError(f"no archive at {self.location}")
            return path.open("rb")
        try:
            fs, inner = filesystems.open_location(self.location)
        except filesystems.LocationError as err:
            raise ArchiveError(str(err)) from None
        try:
            data = _remote_bytes(fs, inner, self.location)
        except OSError as err:
            raise ArchiveError(f"cannot read the archive at {self.location}: {err}") from None
        if data is None:
            raise ArchiveError(f"no archive at {self.location}")
        return io.BytesIO(data)

    def _read_header(self, handle: IO[bytes]) -> tuple[dict[str, Any], EntryDecoder, str, bytes]:
        if handle.read(4) != _MAGIC:
            raise ArchiveError(f"{self.location} is not an Avro object container file (bad magic)")
        handle.seek(0)
        try:
            header = fastavro.schemaless_reader(handle, _HEADER_SCHEMA, None)
            assert isinstance(header, dict)
            meta = header["meta"]
            parsed = fastavro.parse_schema(json.loads(meta["avro.schema"]))
            codec = meta.get("avro.codec", b"null").decode()
        except ArchiveError:
            raise
        except Exception as err:
            raise ArchiveError(f"{self.location}: unreadable Avro header ({err})") from None
        if not isinstance(parsed, dict):
            raise ArchiveError(f"{self.location} is an Avro file but not a tailguard archive")
        schema: dict[str, Any] = parsed
        decoder = decoder_for(schema, self.location, self._legacy())
        if codec not in ("null", "deflate"):
            raise ArchiveError(f"{self.location}: unsupported Avro codec {codec!r}")
        return schema, decoder, codec, header["sync"]

    def _legacy(self) -> Codec:
        if self._legacy_codec is None:
            from tailguard.codec import SingleObjectCodec

            self._legacy_codec = SingleObjectCodec()
        return self._legacy_codec

    def __iter__(self) -> Iterator[Envelope]:
        with self._open() as handle:
            _, decoder, codec, sync = self._read_header(handle)
            read = 0
            for count, block in self._blocks(handle, sync):
                data = zlib.decompress(block, -15) if codec == "deflate" else block
                yield from read_block(decoder, data, count, read)
                read += count

    def _blocks(self, handle: IO[bytes], sync: bytes) -> Iterator[tuple[int, bytes]]:
        while True:
            start = handle.tell()
            count = _read_long(handle)
            length = _read_long(handle) if count is not None else None
            if count is None or length is None:
                return  # end of file, or a block header still being written
            data = handle.read(length)
            marker = handle.read(_SYNC_SIZE)
            if len(data) < length or len(marker) < _SYNC_SIZE:
                return  # the final block is still being written
            if marker != sync or count < 0 or length < 0:
                raise ArchiveError(f"{self.location}: damaged block at byte {start}")
            yield count, data


def _drop_torn_tail(path: Path, complete: int) -> None:
    """Cut a block that a killed writer left half-written (kill -9 mid-flush): appending after
    it would put a damaged block in the middle of the archive, which no reader gets past."""
    size = path.stat().st_size
    if complete < size:
        log.warning(
            "archive %s: dropping %d bytes of an incomplete last block (its writer died)",
            path,
            size - complete,
        )
        with path.open("r+b") as handle:
            handle.truncate(complete)


def open_archive(location: str | Path, settings: Settings) -> ArchiveReader:
    """The archive at `location` as a deployment with `settings` reaches it: a URI through the
    `s3.*` settings (or the AWS default chain), entries of the older format decoded with the
    deployment's codec (a schema registry's, if one is set)."""
    from tailguard.codec import codec_for

    filesystems.configure_from(settings)
    return ArchiveReader(location, legacy_codec=codec_for(settings))


def _read_long(handle: IO[bytes]) -> int | None:
    """An Avro zig-zag varint, or None at (possibly mid-number) end of file."""
    shift = 0
    accum = 0
    while True:
        byte = handle.read(1)
        if not byte:
            return None
        accum |= (byte[0] & 0x7F) << shift
        if not byte[0] & 0x80:
            return (accum >> 1) ^ -(accum & 1)
        shift += 7


def archive_exists(location: str | Path) -> bool:
    """Whether an archive with any content is at `location` (a path or a URI: its object, or
    the parts a writer uploaded before it died)."""
    location = _location(location)
    if filesystems.is_local(location):
        path = Path(location)
        return path.exists() and path.stat().st_size > 0
    # Asked of the listing, not by downloading and joining the whole archive (which a reader
    # then downloads again).
    fs, inner = filesystems.open_location(location)
    if fs.get_file_info(inner).type == pafs.FileType.File:
        return True
    selector = pafs.FileSelector(f"{inner}{PARTS_SUFFIX}", allow_not_found=True)
    return any(
        info.type == pafs.FileType.File and info.base_name.isdigit()
        for info in fs.get_file_info(selector)
    )
