"""`tailguard run JOB.py`: run a job file on a Spark cluster under the control plane.

A job file defines `main(params: dict) -> tailguard.Job`; `--param key=value` fills `params`.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from tailguard.agent.graph.api import Job
from tailguard.logs import add_format_argument, hide_secrets


class JobFileError(RuntimeError):
    pass


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_file", metavar="JOB.py", help="a Python file defining main(params)")
    parser.add_argument(
        "--master",
        help="Spark master URL (default: the local cluster started by `tailguard cluster up`, "
        "else local[2])",
    )
    parser.add_argument(
        "--param", action="append", default=[], metavar="KEY=VALUE", help="passed to main()"
    )
    parser.add_argument(
        "--no-services",
        action="store_true",
        help="do not wait for the services: every decision is the agent's local fallback",
    )
    parser.add_argument(
        "--log",
        choices=("kafka", "archive"),
        default="kafka",
        help="publish facts to Kafka (default) or keep them in the archive only",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--recover",
        metavar="JOB_ID",
        help="take over job JOB_ID, whose driver died: rebuild it from its archive and the "
        "topics, keep what it finished, run the rest (same JOB.py, --param and settings)",
    )
    add_format_argument(parser, default=argparse.SUPPRESS)


def load_job_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise JobFileError(f"no job file at {path}")
    spec = importlib.util.spec_from_file_location(f"tailguard_job_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise JobFileError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    # Registered so cloudpickle ships functions defined in the file by value to the executors.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    if not callable(getattr(module, "main", None)):
        raise JobFileError(f"{path} defines no main(params) -> tailguard.Job")
    return module


def parse_params(items: list[str]) -> dict[str, str]:
    params: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise JobFileError(f"--param needs KEY=VALUE, got {item!r}")
        params[key.strip()] = value
    return params


def default_master(work_dir: Path) -> str:
    from tailguard.cluster.local import ClusterError, LocalCluster

    try:
        cluster = LocalCluster.attach(work_dir / "cluster")
    except ClusterError:
        return "local[2]"
    return cluster.master_url if cluster.processes_alive() else "local[2]"


def run(args: argparse.Namespace) -> int:
    from pyspark import cloudpickle

    from tailguard.agent.adapters.spark import session_builder
    from tailguard.agent.driver.recovery import RecoveryError
    from tailguard.agent.entry import run as run_job
    from tailguard.settings_file import load_settings

    settings = load_settings(getattr(args, "config", None))
    hide_secrets(settings)  # from the log lines of `--log-format`, whatever logs them
    try:
        module = load_job_file(Path(args.job_file))
        cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]
        params = {"work_dir": settings["tailguard.work-dir"], **parse_params(args.param)}
        job = module.main(params)
        if not isinstance(job, Job):
            raise JobFileError(f"main() returned {type(job).__name__}, not a tailguard.Job")
    except JobFileError as err:
        print(f"tailguard run: {err}", file=sys.stderr)
        return 2
    master = args.master or default_master(Path(settings["tailguard.work-dir"]))
    print(f"{'recovering ' + args.recover if args.recover else 'running ' + job.name} on {master}")
    spark = session_builder(master, app_name=f"tailguard {job.name}").getOrCreate()
    try:
        result = run_job(
            job,
            spark,
            log_mode=args.log,
            services=not args.no_services,
            settings=settings,
            progress=not args.no_progress,
            recover=args.recover,
        )
    except RecoveryError as err:
        print(f"tailguard run: cannot recover: {err}", file=sys.stderr)
        return 2
    finally:
        spark.stop()
    print(result.summary())
    return 0 if result.ok else 1
