"""The `tailguard` command.

Each subcommand lives in the package that owns it and exposes `add_arguments(parser)` and
`run(args) -> int`; this module only wires them up, importing a subcommand's module when that
subcommand is used, so `tailguard broker` does not pay for importing Spark.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from tailguard import __version__
from tailguard.extras import missing_extra
from tailguard.logs import add_format_argument
from tailguard.logs import configure as configure_logs
from tailguard.model.config import ConfigError

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "broker": ("tailguard.broker.cli", "the embedded broker, Apache Kafka: up, down, status"),
    "services": (
        "tailguard.shell.services_cli",
        "the services: up, down, status, or run one in the foreground",
    ),
    "run": (
        "tailguard.agent.run_cli",
        "run a job file (main(params) -> Job) under the control plane, or --recover one",
    ),
    "demo": ("tailguard.demo", "the end-to-end demo: broker, 3-node cluster, services, a job"),
    "replay": ("tailguard.replay.cli", "re-run the decision cores over a recorded log and compare"),
    "cluster": ("tailguard.cluster.cluster_cli", "local Spark cluster: up, down, status, throttle"),
    "stack": (
        "tailguard.stack_cli",
        "the local stack in one command (broker, services, cluster): up, down, status",
    ),
    "bench": ("tailguard.bench.bench_cli", "tailguard vs Spark's speculation on a local cluster"),
    "blocklist": (
        "tailguard.blocklist.cli",
        "the cluster-wide blocklist: list, add HOST, remove HOST (signed as operator), export",
    ),
}

# Seeing what a job did, from its archive (tailguard.inspect).
SUBCOMMANDS.update(
    {
        "timeline": ("tailguard.inspect.timeline_cli", "draw a job: HTML page or Perfetto trace"),
        "explain": ("tailguard.inspect.explain_cli", "why a record is in the log: its causes"),
        "export": ("tailguard.inspect.export_cli", "an archive as rows: JSON Lines or Parquet"),
    }
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tailguard",
        description="Event-sourced control plane for PySpark batch jobs.",
    )
    parser.add_argument("--version", action="version", version=f"tailguard {__version__}")
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="TOML settings file (default: ./tailguard.toml if present); any setting can also "
        "come from the environment (TAILGUARD_<KEY>, see docs/configuration.md)",
    )
    # How the command (and the services `services up` starts) log: tailguard.logs.
    add_format_argument(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        sub_parser.set_defaults(_module=module_name)
        # Arguments are added lazily for the chosen command only; see main().
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _dispatch(argv)
    except ModuleNotFoundError as err:
        # A command of an extra that is not installed (`tailguard run` without tailguard[spark]).
        missing = missing_extra(err, f"tailguard {next((a for a in argv if a in SUBCOMMANDS), '')}")
        if missing is None:
            raise
        print(missing, file=sys.stderr)
        return 2
    except ConfigError as err:
        # Bad settings (file, environment or flags) of any subcommand: the message names the
        # setting and never shows a secret value.
        print(f"tailguard: {err}", file=sys.stderr)
        return 2


def _dispatch(argv: list[str]) -> int:
    parser = build_parser()
    # Find the subcommand first so only its module is imported.
    chosen = next((a for a in argv if a in SUBCOMMANDS), None)
    if chosen is not None:
        module = importlib.import_module(SUBCOMMANDS[chosen][0])
        sub_action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        module.add_arguments(sub_action.choices[chosen])
    args = parser.parse_args(argv)
    if args.log_format:
        configure_logs(args.log_format)
    module = importlib.import_module(args._module)
    try:
        return int(module.run(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
