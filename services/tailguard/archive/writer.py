"""The archive's writer: appends typed entries to a local file, or to a local spool file kept
as a remote copy of an archive at a URI (`archive/remote.py`). See `tailguard.archive`."""

from __future__ import annotations

from pathlib import Path
from typing import IO

from fastavro.write import Writer

from tailguard import filesystems
from tailguard.archive.entries import Direction, EntryEncoder, current_entry_schema
from tailguard.archive.reader import ArchiveReader, drop_torn_tail, normalised_location
from tailguard.archive.remote import RemoteCopy
from tailguard.model.records import Record

# The remote copy's upload interval unless told otherwise: what a lost driver can lose at most.
DEFAULT_UPLOAD_INTERVAL_S = 10.0


class ArchiveWriter:
    """Appends typed entries to the archive at `location` (created, or continued if it exists
    and was written with today's schemas): a local path, or a `pyarrow.fs` URI kept as a remote
    copy of a local spool file (`tailguard.archive`), uploaded every `upload_interval_s` and at
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
        self.location = normalised_location(location)
        self.flush_every = flush_every
        self._remote: RemoteCopy | None = None
        if filesystems.is_local(self.location):
            self.path = Path(self.location)
            self.path.parent.mkdir(parents=True, exist_ok=True)
        else:
            self._remote = RemoteCopy(self.location, upload_interval_s)
            self.path = self._remote.start(spool_dir, _continuable)
        existing = self.path.exists() and self.path.stat().st_size > 0
        if existing and self._remote is None:
            # Checked before fastavro appends to it, for a clear error on a foreign file.
            reader = ArchiveReader(self.path)
            reader.check_continuable()
            drop_torn_tail(self.path, reader.complete_length())
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


def _continuable(spool: Path) -> None:
    ArchiveReader(spool).check_continuable()
