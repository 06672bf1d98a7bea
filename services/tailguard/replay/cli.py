"""`tailguard replay`: audit the decisions in a recorded log, or ask what other settings would do.

tailguard replay work/archive/JOB.avro              # audit
tailguard replay --topic                            # the same, reading the Kafka topics
tailguard replay ARCHIVE --what-if what-if.toml     # how decisions would differ under these
tailguard --config deploy.toml replay ARCHIVE       # the deployment settings: before the command

An audit needs no settings file: each service recorded the policy settings it decided with in
the log, and the replay decides with those (`replay.recorded_settings`); the deployment's
settings still say where the log is (brokers, `s3.*`) and stand in for the policy settings of a
log that recorded none (written before the services announced them). A what-if's settings go
over the recorded ones.

Exit status, the same for an audit and a what-if, so a CI step can rely on it: 0 every decision
reproduced (no difference), 1 at least one difference, 2 a usage or input error (no log, an
unreadable archive, bad settings, nothing of the job in the log).
"""

from __future__ import annotations

import argparse
import sys

from tailguard.model.config import REDACTED, ConfigError, is_secret
from tailguard.replay.engine import ReplayReport, replay, settings_diff
from tailguard.replay.inputs import LogReadError, read_archive, read_topics
from tailguard.settings_file import load_settings, read_toml

SHOW_DIFFERENCES = 5
NO_DIFFERENCE, DIFFERENCES, USAGE_ERROR = 0, 1, 2

# Before --what-if existed, `replay --config FILE` was the what-if file, while the top-level
# `--config` is the deployment's: the same flag with two meanings let a CI audit that meant the
# latter silently become a what-if (which then exited 0). It is now refused, naming both.
MISPLACED_CONFIG = (
    "--config after `replay` is no longer the what-if file: use --what-if FILE; the deployment "
    "settings go before the command (tailguard --config FILE replay ...)"
)


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
        "--what-if",
        metavar="FILE",
        help="replay with these policy settings (TOML) and report how decisions would differ",
    )
    parser.add_argument("--config", dest="misplaced_config", help=argparse.SUPPRESS)
    parser.add_argument("--show", type=int, default=SHOW_DIFFERENCES, help="differences to print")


def _usage_error(message: str) -> int:
    print(f"tailguard replay: {message}", file=sys.stderr)
    return USAGE_ERROR


def run(args: argparse.Namespace) -> int:
    if getattr(args, "misplaced_config", None):
        return _usage_error(MISPLACED_CONFIG)
    try:
        settings = load_settings(getattr(args, "config", None))
        what_if = read_toml(args.what_if) if args.what_if else {}
    except ConfigError as err:
        return _usage_error(str(err))
    if bool(args.archive) == bool(args.topic):
        return _usage_error("give an ARCHIVE file or --topic (one of them)")
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
            overrides=what_if or None,
        )
    except LogReadError as err:
        return _usage_error(str(err))
    if not report.jobs:
        # Nothing was audited: passing would let an audit of the wrong log or job go unnoticed.
        of_job = f" of job {args.job}" if args.job else ""
        return _usage_error(f"no events{of_job} in {source}: nothing to replay")
    print(f"replayed {report.events} events of {len(report.jobs)} job(s) from {source}")
    _print_settings(report)
    if what_if:
        # Against what the services decided with: the settings recorded in the log, if any.
        live = next((plan.live for plan in report.settings if plan.live is not None), settings)
        for key, (old, new) in settings_diff(live, what_if).items():
            # A what-if file may also hold connection settings: never print a secret.
            shown = (REDACTED, REDACTED) if is_secret(key) else (old, new)
            print(f"  what-if {key}: {shown[0]} -> {shown[1]}")
    _print(report, args.show, bool(what_if))
    return DIFFERENCES if report.differences else NO_DIFFERENCE


def _print_settings(report: ReplayReport) -> None:
    recorded = [plan for plan in report.settings if plan.recorded]
    if len(recorded) == len(report.settings):
        print("settings: as the services recorded them in the log")
    elif not recorded:
        print("settings: the log records none; the settings given (--config, or the defaults)")
    for plan in report.settings:
        if 0 < len(recorded) < len(report.settings) or len(plan.versions) > 1:
            print(f"  {plan.describe()}")


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
