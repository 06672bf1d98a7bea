"""`python -m tailguard.observer jar|export`: the listener's jar path (for `spark-submit --jars`),
and the fleet blocklist in a platform's form (`tailguard blocklist export`: `blocklist/cli.py`)."""

from __future__ import annotations

import argparse
import sys

from tailguard.blocklist.cli import add_export_arguments, run_export
from tailguard.observer.jar import JarBuildError, listener_jar


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tailguard.observer")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    verbs.add_parser("jar", help="build (once) and print the listener's jar")
    export = verbs.add_parser("export", help="the fleet blocklist for submission")
    add_export_arguments(export)
    export.add_argument("--config", help="tailguard settings file (default: tailguard.toml)")
    args = parser.parse_args(argv)
    if args.verb == "export":
        return run_export(args)
    try:
        print(listener_jar())
    except JarBuildError as exc:
        print(f"tailguard observe: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
