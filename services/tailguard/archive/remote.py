"""The remote copy of an archive at a URI (S3 and most object stores cannot append): parts
`<archive>.parts/<byte offset>` while it grows, one object `<archive>` at the end, and reading
the object joined with the parts after it (what a crashed writer left). See `tailguard.archive`.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pyarrow.fs as pafs

from tailguard import filesystems
from tailguard.archive.entries import ArchiveError

log = logging.getLogger(__name__)

PARTS_SUFFIX = ".parts"


class RemoteCopy:
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

    def start(self, spool_dir: str | Path | None, check: Callable[[Path], None]) -> Path:
        """The spool file, holding the remote archive if there is one (which the writer then
        continues), normalised to one object so that new parts follow it. `check` raises
        ArchiveError unless the spool holds an archive today's writer may continue."""
        directory = Path(spool_dir or Path(tempfile.gettempdir()) / "tailguard-archive-spool")
        directory.mkdir(parents=True, exist_ok=True)
        name = self.inner.rsplit("/", 1)[-1]
        spool = directory / f"{name}.{uuid.uuid4().hex[:12]}.spool"
        try:
            existing = remote_bytes(self.fs, self.inner, self.location) or b""
        except OSError as err:
            self.abandon(spool)
            raise ArchiveError(f"cannot reach the archive at {self.location}: {err}") from None
        spool.write_bytes(existing)
        if existing:
            try:
                check(spool)  # before anything is written there
            except ArchiveError as err:
                self.abandon(spool)
                raise ArchiveError(f"{self.location} holds no tailguard archive: {err}") from None
            filesystems.put(self.fs, self.inner, existing)
            delete_parts(self.fs, self.inner)
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
        delete_parts(self.fs, self.inner)
        spool.unlink()


class _PartVanished(Exception):
    """A part listed a moment ago is gone: its writer closed meanwhile (read again)."""


def delete_parts(fs: pafs.FileSystem, inner: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        fs.delete_dir(f"{inner}{PARTS_SUFFIX}")


def remote_bytes(fs: pafs.FileSystem, inner: str, location: str) -> bytes | None:
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
