"""The archive's reader: its entries in order, from a local path or a URI; and the repair of a
block a killed writer left half-written. See `tailguard.archive`."""

from __future__ import annotations

import io
import json
import logging
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import fastavro
import pyarrow.fs as pafs

from tailguard import filesystems
from tailguard.archive.entries import (
    ArchiveError,
    EntryDecoder,
    Envelope,
    decoder_for,
    is_current,
    read_block,
)
from tailguard.archive.remote import PARTS_SUFFIX, remote_bytes
from tailguard.codec.protocol import RecordCodec
from tailguard.model.config import Settings

log = logging.getLogger(__name__)

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


def normalised_location(location: str | Path) -> str:
    """`location` as the archive names it (a path or a URI); ArchiveError if it is neither."""
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

    def __init__(self, location: str | Path, legacy_codec: RecordCodec | None = None) -> None:
        self.location = normalised_location(location)
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
            data = remote_bytes(fs, inner, self.location)
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

    def _legacy(self) -> RecordCodec:
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


def drop_torn_tail(path: Path, complete: int) -> None:
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
    location = normalised_location(location)
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
