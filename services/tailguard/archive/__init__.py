"""The archive: one Avro object container file per job, the durable audit log.

Every record the agent publishes or receives (and decisions it takes locally while the services
are unreachable) is appended as a typed entry (`archive/entries.py`): the record itself, in a union
of every record schema, with the topic it travelled on, when and how it was archived. So the file
is a standard Avro object container file whose records any Avro tool reads as records, not as
opaque bytes. Archives of the older format (each record's encoded bytes) are read too.

The writer flushes a block every `flush_every` records, on `flush()` and on `close()`, so a
reader sees records while the writer still runs. A reader stops quietly at an incomplete final
block (one still being written); a damaged block before the end is an error.

An archive can live at any `pyarrow.fs` URI (`s3://bucket/archive/job.avro`), so it survives a
driver container. S3 and most object stores cannot append, so the writer writes a local spool
file and keeps a remote copy (`remote.py`): every upload interval the bytes flushed since the
last upload go up as one part object, `<archive>.parts/<byte offset>`, and at close the whole
file is uploaded as `<archive>` and the parts are deleted. A reader joins `<archive>` (if any)
and the parts after it, so a crashed driver's archive is readable up to its last part: a lost
driver loses at most the records of its last upload interval (plus those not yet flushed). The
Kafka topics remain the complete log (`tailguard replay --topic`).

The writer (`archive/writer.py`), the remote copy (`archive/remote.py`) and the reader
(`archive/reader.py`) are separate roles; this package exports what their users need.
"""

from tailguard.archive.entries import ArchiveError, Direction, Envelope
from tailguard.archive.reader import ArchiveReader, archive_exists, open_archive
from tailguard.archive.remote import PARTS_SUFFIX
from tailguard.archive.writer import DEFAULT_UPLOAD_INTERVAL_S, ArchiveWriter

__all__ = [
    "DEFAULT_UPLOAD_INTERVAL_S",
    "PARTS_SUFFIX",
    "ArchiveError",
    "ArchiveReader",
    "ArchiveWriter",
    "Direction",
    "Envelope",
    "archive_exists",
    "open_archive",
]
