"""`tailguard blocklist list|add|remove|export`: the cluster-wide (fleet) blocklist, as operators
see it.

`list` reads the compacted topic `tailguard.blocklist` to its end and prints the blocks in
force; `export --format yarn|k8s|hosts` prints them in a platform's form for the next
submission (`blocklist/export.py`). `add HOST --for DURATION --reason TEXT` drains a host:
an entry signed by `operator` (`model/authority.py`), which every job that starts before it
expires applies. `remove HOST` publishes a tombstone signed the same way. Both take effect for
jobs that start afterwards; a running job keeps the blocks it holds until their time is up.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime

from confluent_kafka import KafkaException

from tailguard.blocklist import fleet_topic
from tailguard.blocklist.export import FORMATS, export_hosts
from tailguard.kafka.bootstrap import BrokerError
from tailguard.model.authority import OPERATOR
from tailguard.model.config import ConfigError, parse_duration_ms
from tailguard.model.fleet import FleetBlock, current_entries
from tailguard.model.ids import derived_id
from tailguard.settings_file import load_settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    listing = verbs.add_parser("list", help="the blocks in force now")
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    add = verbs.add_parser("add", help="block a host for every job (an operator draining it)")
    add.add_argument("host")
    add.add_argument("--for", dest="duration", required=True, help='how long, e.g. "30 min"')
    add.add_argument("--reason", required=True, help="why, recorded in every job it affects")
    remove = verbs.add_parser("remove", help="take a host off the list")
    remove.add_argument("host")
    export = verbs.add_parser("export", help="the blocks in force, for the next submission")
    add_export_arguments(export)


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    """`export`'s arguments, which `python -m tailguard.observer export` shares (`--config` is
    the caller's: `tailguard` takes it before the subcommand)."""
    parser.add_argument("--format", required=True, choices=FORMATS, help="the target's form")


def run_export(args: argparse.Namespace) -> int:
    """`export` alone, for `python -m tailguard.observer export`."""
    return run(argparse.Namespace(**{**vars(args), "verb": "export"}))


def run(args: argparse.Namespace) -> int:
    settings = load_settings(getattr(args, "config", None))
    now = int(time.time() * 1000)
    if args.verb in ("list", "export"):
        try:
            entries = current_entries(fleet_topic.read_changes(settings), now)
        except (BrokerError, KafkaException, TimeoutError) as err:  # no broker, or none answers
            print(f"tailguard blocklist {args.verb}: {err}", file=sys.stderr)
            return 2
        if args.verb == "export":
            return export_hosts(args.format, list(entries), f"tailguard blocklist {args.verb}")
        _print(list(entries.values()), now, args.json)
        return 0
    host = args.host.strip()
    if not host:
        print("tailguard blocklist: HOST is empty", file=sys.stderr)
        return 2
    if args.verb == "add":
        try:
            duration = parse_duration_ms(args.duration)
        except ConfigError as err:
            print(f"tailguard blocklist add: --for: {err}", file=sys.stderr)
            return 2
        if duration <= 0:
            print(f"tailguard blocklist add: --for must be positive, not {args.duration!r}",
                  file=sys.stderr)  # fmt: skip
            return 2
        if not args.reason.strip():
            print("tailguard blocklist add: --reason is empty", file=sys.stderr)
            return 2
        entry_id = derived_id(OPERATOR, "add", host, now)
        entry = FleetBlock(
            job_id=OPERATOR,
            ts=now,
            id=entry_id,
            host=host,
            until_ts=now + duration,
            cause=f"operator: {args.reason.strip()}",
            evidence=(entry_id,),
        )
    else:
        entry = fleet_topic.operator_removal(host, now)
    fleet_topic.publish(settings, entry, OPERATOR)
    done = "removed" if entry.removed else f"blocked until {_when(entry.until_ts or 0)}"
    print(f"{host}: {done} ({entry.id})")
    return 0


def _when(ts: int) -> str:
    return datetime.fromtimestamp(ts / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _print(entries: list[FleetBlock], now: int, as_json: bool) -> None:
    for e in sorted(entries, key=lambda e: e.host):
        left = ((e.until_ts or now) - now) // 1000
        if as_json:
            row = {"host": e.host, "until_ts": e.until_ts, "cause": e.cause,
                   "evidence": list(e.evidence), "id": e.id}  # fmt: skip
            print(json.dumps(row))
        else:
            print(f"{e.host}\tuntil {_when(e.until_ts or 0)} ({left} s left)\t{e.cause}"
                  f"\tevidence {', '.join(e.evidence)}")  # fmt: skip
    if not entries and not as_json:
        print("no host is on the fleet blocklist")
