"""`tailguard explain ARCHIVE ID`: the causal chain of a command, finding or event.

ID is a record id (or a unique start of one), or an attempt named `vertex#subtask.attempt` as
the timeline names it.
"""

from __future__ import annotations

import argparse
import sys

from tailguard.inspect.explain import UnknownId, explain, find, render_text
from tailguard.inspect.reading import (
    InspectError,
    add_archive_arguments,
    fail,
    load_history,
    settings_of,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_archive_arguments(parser)
    parser.add_argument("id", metavar="ID", help="a record id, its unique start, or vertex#s.a")
    parser.add_argument(
        "--depth", type=int, default=12, help="how many causes deep to follow (default 12)"
    )


def run(args: argparse.Namespace) -> int:
    try:
        history = load_history(args.archive, settings_of(args), args.job)
        record = find(history, args.id)
    except (InspectError, UnknownId) as err:
        return fail("explain", err)
    sys.stdout.write(render_text(explain(history, record, depth=args.depth)))
    return 0
