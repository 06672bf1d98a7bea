"""`tailguard replay`: audit the decisions in a recorded log, or ask what other settings would do.

tailguard replay work/archive/JOB.avro              # audit: exit 1 on any difference
tailguard replay --topic                            # the same, reading the Kafka topics
tailguard replay ARCHIVE --config what-if.toml      # what-if: how decisions would differ
"""

from __future__ import annotations

import argparse
import sys

from tailguard.model.config import REDACTED, ConfigError, is_secret
from tailguard.replay.engine import ReplayReport, replay, settings_diff
from tailguard.replay.inputs import LogReadError, read_archive, read_topics
from tailguard.settings_file import load_settings, read_toml

SHOW_DIFFERENCES = 5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "archive",
        nargs="?",
        help="a per-job Avro archive written by the agent: a path or a URI (s3://bucket/a.avro)",
    )
    parser.add_argument(
        "--topic",
        action="store_true",
        help="read the three Kafka topics from the beginning instead of an archive",
    )
    parser.add_argument("--job", help="only this job id")
    parser.add_argument(
        "--config",
        dest="what_if",
        metavar="FILE",
        help="what-if: replay with these policy settings and report how decisions would differ",
    )
    parser.add_argument("--show", type=int, default=SHOW_DIFFERENCES, help="differences to print")


def run(args: argparse.Namespace) -> int:
    try:
        settings = load_settings(getattr(args, "config", None))
        what_if = read_toml(args.what_if) if args.what_if else {}
    except ConfigError as err:
        print(f"tailguard replay: {err}", file=sys.stderr)
        return 2
    if bool(args.archive) == bool(args.topic):
        print("tailguard replay: give an ARCHIVE file or --topic (one of them)", file=sys.stderr)
        return 2
    try:
        if args.archive:
            log = read_archive(args.archive, settings)
            source = args.archive
        else:
            log = read_topics(settings, job=args.job)
            source = "Kafka topics"
        report = replay(
            log,
            settings.merged(what_if) if what_if else settings,
            what_if=bool(what_if),
            job=args.job,
        )
    except LogReadError as err:
        print(f"tailguard replay: {err}", file=sys.stderr)
        return 2
    print(f"replayed {report.events} events of {len(report.jobs)} job(s) from {source}")
    if what_if:
        for key, (old, new) in settings_diff(settings, what_if).items():
            # A what-if file may also hold connection settings: never print a secret.
            shown = (REDACTED, REDACTED) if is_secret(key) else (old, new)
            print(f"  what-if {key}: {shown[0]} -> {shown[1]}")
    _print(report, args.show, bool(what_if))
    if what_if:
        return 0
    return 1 if report.differences else 0


def _print(report: ReplayReport, show: int, what_if: bool) -> None:
    for service in report.services:
        line = service.line()
        if what_if and service.compared:
            line = (
                f"{service.service}: {service.recorded} {service.output_kind} live, "
                f"{service.replayed} under the what-if settings, "
                f"{len(service.differences)} would differ"
            )
        print(line)
        for diff in service.differences[:show]:
            print(f"    {diff.describe()}")
        if len(service.differences) > show:
            print(f"    ... and {len(service.differences) - show} more")
    for line in report.notes(show):
        print(line)
