"""`tailguard export ARCHIVE --format jsonl|parquet -o FILE`: the archive as rows.

One row per archived record (type, ids, ts, direction, fields); `-o -` writes JSON Lines to
standard output. See inspect/export.py for the columns.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from tailguard.inspect.export import FORMATS, write_jsonl, write_parquet
from tailguard.inspect.history import Archived
from tailguard.inspect.reading import (
    InspectError,
    add_archive_arguments,
    archived,
    fail,
    settings_of,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_archive_arguments(parser)
    parser.add_argument("--format", choices=FORMATS, default="jsonl", help="default jsonl")
    parser.add_argument(
        "-o", "--output", metavar="FILE", required=True, help="the file to write; - for stdout"
    )


def run(args: argparse.Namespace) -> int:
    if args.output == "-" and args.format != "jsonl":
        return fail("export", ValueError(f"{args.format} cannot go to standard output; give -o"))
    output = Path(args.output)
    try:
        everything = archived(args.archive, settings_of(args))
        entries = (e for e in everything if args.job in (None, e.record.job_id))
        if args.output == "-":
            return _to_stdout(entries)
        # The rows go to a temporary file first, so a failure leaves no half-written export.
        partial = output.with_name(output.name + ".partial")
        output.parent.mkdir(parents=True, exist_ok=True)
        if args.format == "parquet":
            count = write_parquet(entries, partial)
        else:
            with partial.open("w", encoding="utf-8") as out:
                count = write_jsonl(entries, out)
        partial.replace(output)
    except (InspectError, OSError) as err:
        return fail("export", err)
    finally:
        if args.output != "-":
            output.with_name(output.name + ".partial").unlink(missing_ok=True)
    print(f"{count} records written to {output}")
    return 0


def _to_stdout(entries: Iterable[Archived]) -> int:
    try:
        write_jsonl(entries, sys.stdout)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader stopped early (`| head`): not an error. Python's advice: point stdout at
        # devnull so the flush at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
