"""A storage root that every executor can reach, through `pyarrow.fs`.

The same code serves a local directory (one machine), HDFS, S3 and any other `pyarrow.fs` URI:
the root is a location that `tailguard.filesystems` normalises (`s3a://` becomes `s3://`, a
relative path absolute) and opens. A `Storage` is shipped inside every pickled `TaskSpec`, so it
carries only that location, never credentials; the filesystem is opened on first use and cached
per process (opening an S3 or HDFS client per task would cost more than many tasks do).

What a write guarantees differs by store (docs/storage.md): on a local disk and HDFS a file is
written under a hidden temporary name and renamed; on an object store (S3, GCS, Azure), which
has no rename, an object is uploaded under its final name in one piece, since an upload appears
whole or not at all.
"""

from __future__ import annotations

import uuid
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from tailguard import filesystems


class Storage:
    """A directory tree on some filesystem; every path it hands out is inside that filesystem."""

    __slots__ = ("_fs", "_uri")

    def __init__(self, root: str) -> None:
        self._uri = filesystems.normalise(root)
        self._fs: tuple[pafs.FileSystem, str] | None = None

    # Pickle only the URI: a filesystem client holds sockets and credentials providers.
    def __getstate__(self) -> dict[str, Any]:
        return {"uri": self._uri}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._uri = state["uri"]
        self._fs = None

    def __repr__(self) -> str:
        return f"Storage({self._uri!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Storage) and other._uri == self._uri

    def __hash__(self) -> int:
        return hash(self._uri)

    @property
    def uri(self) -> str:
        return self._uri

    @property
    def fs(self) -> pafs.FileSystem:
        return self._opened()[0]

    @property
    def root(self) -> str:
        """The root as a path inside `fs`."""
        return self._opened()[1]

    @property
    def object_store(self) -> bool:
        """True on S3, GCS or Azure: uploads are atomic, there is no rename."""
        return filesystems.is_object_store(self.fs)

    def _opened(self) -> tuple[pafs.FileSystem, str]:
        if self._fs is None:
            self._fs = filesystems.open_location(self._uri)
        return self._fs

    def same_filesystem(self, other: Storage) -> bool:
        """True when a path of `other` can be renamed to a path of this storage."""
        return bool(self.fs.equals(other.fs))

    # ------------------------------------------------------------------ paths

    def path(self, *parts: str | int) -> str:
        cleaned = [str(p).strip("/") for p in parts if str(p).strip("/")]
        return "/".join([self.root, *cleaned]) if cleaned else self.root

    @staticmethod
    def temp_sibling(path: str) -> str:
        """A hidden name next to `path`: readers of the directory (Spark, pyarrow datasets)
        skip names starting with '.', so a half-written file is never taken for data."""
        head, _, name = path.rpartition("/")
        return f"{head}/.{name}.{uuid.uuid4().hex}.tmp"

    # ------------------------------------------------------------------ files

    def open_output(self, path: str) -> pa.NativeFile:
        filesystems.make_parent(self.fs, path)
        return self.fs.open_output_stream(path)

    def open_input(self, path: str) -> pa.NativeFile:
        return self.fs.open_input_file(path)

    def read_bytes(self, path: str) -> pa.Buffer:
        with self.open_input(path) as f:
            return f.read_buffer()

    def write_atomic(self, path: str, data: bytes | pa.Buffer) -> None:
        """Write `data` so that `path` is complete or absent (or still its previous version):
        on a local disk or HDFS to a hidden temporary name, then renamed; on an object store
        as one upload under the final name (`filesystems.put`)."""
        if self.object_store:
            filesystems.put(self.fs, path, data)
            return
        temp = self.temp_sibling(path)
        try:
            with self.open_output(temp) as out:
                out.write(data)
            self.move(temp, path)
        except BaseException:
            self.delete_file(temp)
            raise

    def exists(self, path: str) -> bool:
        info = self.fs.get_file_info(path)
        return bool(info.type != pafs.FileType.NotFound)

    def size(self, path: str) -> int | None:
        info = self.fs.get_file_info(path)
        return None if info.type == pafs.FileType.NotFound else int(info.size or 0)

    def delete_file(self, path: str) -> None:
        """Remove a file; a missing one is fine (cleanup is idempotent)."""
        try:
            self.fs.delete_file(path)
        except FileNotFoundError:
            pass
        except OSError:
            if self.exists(path):
                raise

    def delete_dir(self, path: str) -> None:
        """Remove a directory tree; a missing one is fine."""
        try:
            self.fs.delete_dir(path)
        except FileNotFoundError:
            pass
        except OSError:
            if self.exists(path):
                raise

    def move(self, src: str, dst: str) -> None:
        """Rename within this filesystem, replacing `dst`. Atomic on a local disk (POSIX
        rename); on HDFS replacing is delete-then-rename; on S3 a server-side copy (one
        CopyObject, so at most 5 GiB) whose result appears in one piece, then a delete of
        `src`. Fails across devices (the caller copies instead)."""
        filesystems.make_parent(self.fs, dst)
        self.fs.move(src, dst)

    def list_dir(self, path: str) -> list[str]:
        """Names (not paths) directly under `path`, sorted; [] when it does not exist."""
        return sorted(self._listing(path))

    def list_sizes(self, path: str) -> dict[str, int]:
        """The files directly under `path` (names, not paths) and their sizes, in one listing."""
        return {
            info.base_name: int(info.size or 0)
            for info in self._listing(path).values()
            if info.type == pafs.FileType.File
        }

    def _listing(self, path: str) -> dict[str, pafs.FileInfo]:
        selector = pafs.FileSelector(path, allow_not_found=True, recursive=False)
        return {info.base_name: info for info in self.fs.get_file_info(selector)}
