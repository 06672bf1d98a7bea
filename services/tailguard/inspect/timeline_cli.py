"""`tailguard timeline ARCHIVE [-o FILE] [--format html|trace]`: a picture of a job.

html: a self-contained page (no network needed) with a lane per host slot and a bar per attempt.
trace: Chrome trace-event JSON with the same view, for ui.perfetto.dev or chrome://tracing.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tailguard import filesystems
from tailguard.inspect.page import render_page
from tailguard.inspect.reading import (
    InspectError,
    add_archive_arguments,
    fail,
    load_history,
    settings_of,
)
from tailguard.inspect.timeline import build_timeline
from tailguard.inspect.trace import trace_events
from tailguard.model.config import Settings

SUFFIXES = {"html": ".html", "trace": ".trace.json"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_archive_arguments(parser)
    parser.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="where to write (default: next to a local archive, with .html or .trace.json)",
    )
    parser.add_argument("--format", choices=sorted(SUFFIXES), default="html")


def default_output(archive: str, form: str) -> Path:
    """Next to a local archive; in the current directory for an archive at a URI."""
    location = filesystems.normalise(archive)
    path = Path(location) if filesystems.is_local(location) else Path(location.rsplit("/", 1)[-1])
    return path.with_suffix(SUFFIXES[form])


def write_timeline(
    archive: str,
    settings: Settings,
    output: str | Path | None = None,
    form: str = "html",
    job: str | None = None,
) -> Path:
    """Draw the job in `archive` into `output` (default: next to the archive); its path."""
    timeline = build_timeline(load_history(archive, settings, job))
    path = Path(output) if output else default_output(archive, form)
    if form == "trace":
        text = json.dumps(trace_events(timeline), ensure_ascii=False)
    else:
        text = render_page(timeline)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def run(args: argparse.Namespace) -> int:
    try:
        written = write_timeline(
            args.archive, settings_of(args), args.output, args.format, args.job
        )
    except (InspectError, OSError) as err:
        return fail("timeline", err)
    print(written)
    return 0
