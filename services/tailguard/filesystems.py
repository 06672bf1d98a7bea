"""Where tailguard's files live: a local path or any `pyarrow.fs` URI, opened one way everywhere
(sources, result partitions, sinks, the archive, replay). See docs/storage.md.

A location is normalised once, and its scheme is kept from then on:
- `s3a://` and `s3n://` (Hadoop's names, what Spark users write) become `s3://`;
- a local path (or a `file://` URI) becomes an absolute path: a relative one would name
  another directory in an executor, whose working directory is not the driver's;
- any other scheme is kept as given and opened by `pyarrow.fs.FileSystem.from_uri` (gs, hdfs,
  abfs, ...).
A location never carries credentials: a URI with a password (or, for s3 and gs, any user
part) is refused, because locations are recorded (JobSubmitted, results, log lines).

S3 credentials come from the AWS default chain (environment, `~/.aws`, instance profile or
web identity), as pyarrow's `S3FileSystem` finds them, or from the settings with Flink's key
names (`S3Options.from_settings`). The settings reach this process through `configure`: the
driver calls it with its settings, a slot runner with what its driver sent over their
authenticated connection, replay with its settings.

A filesystem is opened once per process per (scheme, authority) and cached: opening an S3,
GCS or HDFS client per file or per task would cost more than many tasks do.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pyarrow.fs as pafs

from tailguard.model.config import ConfigError

# Flink's key names (flink-s3-fs-hadoop/-presto forward `s3.*` to `fs.s3a.*`).
S3_ACCESS_KEY = "s3.access-key"
S3_SECRET_KEY = "s3.secret-key"
S3_ENDPOINT = "s3.endpoint"
S3_PATH_STYLE = "s3.path.style.access"
S3_REGION = "s3.endpoint.region"
S3_SETTINGS = (S3_ACCESS_KEY, S3_SECRET_KEY, S3_ENDPOINT, S3_PATH_STYLE, S3_REGION)

# Hadoop's S3 connector names for the same store.
_SCHEME_ALIASES = {"s3a": "s3", "s3n": "s3"}
# Schemes whose URI authority is a bucket: a user part there could only be a credential.
_BUCKET_SCHEMES = ("s3", "gs", "gcs")
# Stores where a single object upload is atomic and there is no rename (`move` copies).
_OBJECT_STORES = ("s3", "gcs", "abfs")
_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# `pathlib.Path("s3://b/k")` is "s3:/b/k": a URI that lost a slash, easy to pass by mistake.
_LOST_SLASH = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):/(?!/)")
_REMOTE_SCHEMES = ("s3", "s3a", "s3n", "gs", "gcs", "hdfs", "viewfs", "abfs", "abfss")
_USER_PART = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*:/{1,2})[^/@]*@")
# A path segment no real location uses: opening `<scheme>://<authority>/<probe>` once tells how
# that filesystem spells the paths under the authority (bucket/key, container/path, /path).
_PROBE = "__tailguard_probe__"


class LocationError(ValueError):
    """A storage location that cannot be used; the message names the location and the reason."""


# ---------------------------------------------------------------------- locations


def _shown(text: str) -> str:
    """`text` as an error message may show it: without a URI's user part (a credential)."""
    return _USER_PART.sub(r"\1", text)


def normalise(location: str | os.PathLike[str]) -> str:
    """The canonical form of `location`: an absolute local path, or a URI with its scheme."""
    text = os.fspath(location).strip()
    if not text:
        raise LocationError("empty storage location")
    match = _URI.match(text)
    if match is None:
        lost = _LOST_SLASH.match(text)
        if lost and lost.group(1).lower() in _REMOTE_SCHEMES:
            raise LocationError(
                f"storage location {_shown(text)!r} looks like a URI that lost a slash "
                f"({lost.group(1)}:/ instead of {lost.group(1)}://), as pathlib.Path does to "
                "URIs: pass the URI as a string"
            )
        if text.lower().startswith("file:"):
            text = "file://" + text[len("file:") :]
            match = _URI.match(text)
    if match is None:
        return os.path.abspath(os.path.expanduser(text))
    scheme = match.group(1).lower()
    scheme = _SCHEME_ALIASES.get(scheme, scheme)
    parts = urlsplit(f"{scheme}://{text[match.end() :]}")
    if parts.fragment:
        raise LocationError(
            f"storage location {_shown(text)!r} has a fragment ('#...'), not a path"
        )
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise LocationError(
                f"storage location {text!r}: a file URI names no host (file:///absolute/path)"
            )
        return os.path.abspath(unquote(parts.path) or "/")
    if parts.password is not None or (scheme in _BUCKET_SCHEMES and parts.username):
        # Named without the credential itself: the message may be logged.
        raise LocationError(
            f"storage location {scheme}://{parts.hostname or ''}{parts.path} carries "
            "credentials in the URI, which would be recorded with it; give them as settings "
            f"({S3_ACCESS_KEY}, {S3_SECRET_KEY}) or through the AWS default chain"
        )
    if scheme in _BUCKET_SCHEMES and not parts.netloc:
        raise LocationError(f"storage location {text!r} names no bucket ({scheme}://BUCKET/...)")
    path = parts.path.rstrip("/")
    query = f"?{parts.query}" if parts.query else ""
    return f"{scheme}://{parts.netloc}{path}{query}"


def is_local(location: str) -> bool:
    """Whether a normalised location is a local path."""
    return _URI.match(location) is None


def join(location: str, *names: str | int) -> str:
    """`location` with `names` appended as path segments (before any URI query)."""
    cleaned = [str(n).strip("/") for n in names if str(n).strip("/")]
    if not cleaned:
        return location
    if is_local(location):
        return os.path.join(location, *cleaned)
    base, sep, query = location.partition("?")
    # Only what would end or break a URI path is escaped; `open_location` unescapes.
    segments = "/".join(
        c.replace("%", "%25").replace("?", "%3F").replace("#", "%23") for c in cleaned
    )
    return f"{base.rstrip('/')}/{segments}{sep}{query}"


def child_location(location: str, root: str, inner_path: str) -> str:
    """The location of `inner_path`, a path that `open_location(location)` listed under its
    inner root `root`: the same URI as `location`, extended by the relative part."""
    if inner_path == root:
        return location
    if not inner_path.startswith(root.rstrip("/") + "/"):
        raise LocationError(f"{inner_path!r} is not under {location}")
    return join(location, inner_path[len(root.rstrip("/")) + 1 :])


# ---------------------------------------------------------------------- S3 settings


@dataclass(frozen=True)
class S3Options:
    """S3 connection settings from tailguard's settings (Flink's key names). Only the driver
    and its runners hold them: the credentials are left out of `repr`, and the object is sent
    only over the runners' authenticated connection, never recorded."""

    endpoint: str | None = None
    region: str | None = None
    path_style: bool | None = None
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)

    @staticmethod
    def from_settings(settings: Mapping[str, str]) -> S3Options | None:
        """The `s3.*` settings, or None when none is set (pyarrow's defaults and the AWS chain
        then apply, with the bucket's region looked up). ConfigError names a bad key, never a
        value that may be a secret."""
        values = {k: str(settings.get(k, "")).strip() for k in S3_SETTINGS}
        if not any(values.values()):
            return None
        access, secret = values[S3_ACCESS_KEY], values[S3_SECRET_KEY]
        if bool(access) != bool(secret):
            given, missing = (
                (S3_ACCESS_KEY, S3_SECRET_KEY) if access else (S3_SECRET_KEY, S3_ACCESS_KEY)
            )
            raise ConfigError(f"{given} is set but {missing} is not: set both or neither")
        style = values[S3_PATH_STYLE].lower()
        if style not in ("", "true", "false"):
            raise ConfigError(f"{S3_PATH_STYLE} must be true or false, not {style!r}")
        return S3Options(
            endpoint=values[S3_ENDPOINT] or None,
            region=values[S3_REGION] or None,
            path_style=None if not style else style == "true",
            access_key=access or None,
            secret_key=secret or None,
        )

    @property
    def credentials(self) -> str:
        """Where the credentials come from, for log lines (never the credentials)."""
        return "settings" if self.access_key else "the AWS default chain"

    def open(self) -> pafs.S3FileSystem:
        scheme = None
        endpoint = self.endpoint
        if endpoint and "://" in endpoint:
            scheme, _, endpoint = endpoint.partition("://")
            endpoint = endpoint.rstrip("/")
        return pafs.S3FileSystem(
            access_key=self.access_key,
            secret_key=self.secret_key,
            region=self.region,
            scheme=scheme,
            endpoint_override=endpoint,
            # pyarrow uses path-style addressing whenever an endpoint is given; virtual hosts
            # only when asked (AWS endpoints without an override are virtual-hosted anyway).
            force_virtual_addressing=bool(endpoint) and self.path_style is False,
        )


# ---------------------------------------------------------------------- opening

_lock = threading.Lock()
_s3_options: S3Options | None = None
# (scheme, authority, query) -> (filesystem, inner prefix of paths under the authority)
_opened: dict[tuple[str, str, str], tuple[pafs.FileSystem, str]] = {}
_LOCAL = pafs.LocalFileSystem()


def configure(options: S3Options | None) -> None:
    """Use `options` for `s3://` locations opened from now on in this process (None: pyarrow's
    defaults and the AWS chain). Filesystems opened with other options are dropped."""
    global _s3_options
    with _lock:
        if options != _s3_options:
            _s3_options = options
            _opened.clear()


def configure_from(settings: Mapping[str, str]) -> S3Options | None:
    """`configure` with the S3 options of `settings`; returns them."""
    options = S3Options.from_settings(settings)
    configure(options)
    return options


def configured_s3() -> S3Options | None:
    with _lock:
        return _s3_options


def open_location(location: str | os.PathLike[str]) -> tuple[pafs.FileSystem, str]:
    """The filesystem holding `location`, and the location as a path inside it."""
    uri = normalise(location)
    if is_local(uri):
        return _LOCAL, uri
    parts = urlsplit(uri)
    path = unquote(parts.path).lstrip("/")
    with _lock:
        if parts.scheme == "s3" and _s3_options is not None and not parts.query:
            # One client for every bucket: the settings name no bucket.
            fs, _ = _cached(("s3", "", ""), lambda: (_s3_options.open(), ""))
            return fs, f"{parts.netloc}/{path}".rstrip("/")
        fs, prefix = _cached(
            (parts.scheme, parts.netloc, parts.query),
            lambda: _open_authority(parts.scheme, parts.netloc, parts.query, uri),
        )
    return fs, (prefix + path).rstrip("/") or prefix


def _cached(
    key: tuple[str, str, str], opener: Callable[[], tuple[pafs.FileSystem, str]]
) -> tuple[pafs.FileSystem, str]:
    opened = _opened.get(key)
    if opened is None:
        opened = _opened[key] = opener()
    return opened


def _open_authority(scheme: str, netloc: str, query: str, uri: str) -> tuple[pafs.FileSystem, str]:
    probe = f"{scheme}://{netloc}/{_PROBE}" + (f"?{query}" if query else "")
    try:
        fs, inner = pafs.FileSystem.from_uri(probe)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError, OSError) as err:
        raise LocationError(f"cannot open storage location {uri}: {err}") from None
    if not inner.endswith(_PROBE):
        raise LocationError(f"cannot tell how {scheme}:// lays out paths ({inner!r})")
    return fs, inner[: -len(_PROBE)]


def is_object_store(fs: pafs.FileSystem) -> bool:
    """Whether `fs` is an object store: a single upload appears whole or not at all, there is
    no rename (`move` is a server-side copy and a delete)."""
    return fs.type_name in _OBJECT_STORES


def make_parent(fs: pafs.FileSystem, path: str) -> None:
    """Create the directory `path` goes into, where `fs` has directories. An object store has
    none to make: a key needs no parent, and the empty marker objects pyarrow would write there
    cost a request per level per file."""
    parent = path.rsplit("/", 1)[0] if "/" in path.strip("/") else ""
    if parent and not is_object_store(fs):
        fs.create_dir(parent, recursive=True)


def put(fs: pafs.FileSystem, path: str, data: bytes | pa.Buffer) -> None:
    """Write `data` as the file `path` in one write. On an object store the upload appears
    whole or not at all: the buffer goes in one `write`, so a failure can only come from the
    upload itself and leaves no object. (Not so for a stream fed piece by piece: closing it
    after the feeder's own error would publish the part written so far.)"""
    make_parent(fs, path)
    with fs.open_output_stream(path) as out:
        out.write(data)
