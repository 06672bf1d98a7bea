"""Opening an archive for the inspect commands, with errors an operator can act on."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator

from tailguard import filesystems
from tailguard.archive import ArchiveError, open_archive
from tailguard.inspect.history import Archived, History, HistoryError, history_of
from tailguard.model.config import ConfigError, Settings
from tailguard.settings_file import load_settings


class InspectError(Exception):
    """The archive cannot be read, or does not hold what was asked for."""


def archived(location: str, settings: Settings) -> Iterator[Archived]:
    """Every entry of the archive at `location` (a path, or a `pyarrow.fs` URI reached with the
    `s3.*` settings as `tailguard replay` does), typed or of the older format (encoded records),
    in the order it was appended."""
    try:
        for envelope in open_archive(location, settings):
            yield Archived(envelope.record, envelope.direction.value, envelope.ts, envelope.topic)
    except (ArchiveError, filesystems.LocationError) as err:
        raise InspectError(str(err)) from None
    except OSError as err:
        raise InspectError(f"cannot read {location}: {err.strerror or err}") from None


def add_archive_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "archive", metavar="ARCHIVE", help="a per-job Avro archive: a path or a URI (s3://...)"
    )
    parser.add_argument("--job", help="the job to show, when the archive holds several")


def settings_of(args: argparse.Namespace) -> Settings:
    """The deployment settings (the top-level --config): they say how records are encoded."""
    try:
        return load_settings(getattr(args, "config", None))
    except ConfigError as err:
        raise InspectError(str(err)) from None


def load_history(archive: str, settings: Settings, job: str | None = None) -> History:
    entries = list(archived(archive, settings))
    try:
        return history_of(entries, job)
    except HistoryError as err:
        raise InspectError(f"{archive}: {err}") from None


def fail(command: str, error: Exception) -> int:
    print(f"tailguard {command}: {error}", file=sys.stderr)
    return 2
