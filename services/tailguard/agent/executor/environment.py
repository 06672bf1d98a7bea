"""Can the executors run this tailguard? Checked once at job start, before any runner starts.

A session built the usual way (`SparkSession.builder...getOrCreate()`, no `PYSPARK_PYTHON`)
starts the executors' Python workers with whatever `python3` they find, which often lacks
tailguard; executors on other machines never have the driver's venv. Without this check every
runner died unpickling its task (`No module named 'tailguard'`) and the job gave up only after
the runners' start timeout (60 s, measured on local[2]), with no word of the fix.

`describe` runs on the executors in whatever interpreter Spark starts there, which may lack
tailguard. So this module imports nothing from tailguard at module level, and the driver ships
it to Spark **by value** (`cloudpickle.register_pickle_by_value`), not as a reference to a
module the executor would have to import. What it reports are plain dicts, which the executor
can pickle without tailguard too.

"The same tailguard" is the same release **and** the same code: `tailguard_build()` is the
version plus a digest of the package's Python sources, because the driver and its runners
exchange pickled tailguard objects, and an editable install or a stale packed environment keeps
the version number while the code moves on. An installed wheel and the source tree it was built
from have the same digest.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
import socket
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

PACKAGE = "tailguard"
# The module a runner imports first: importing it proves the runner's dependencies are there
# (pyarrow, the executor code), not only the package's name.
RUNNER_MODULE = "tailguard.agent.executor.runner"
FIX = (
    "ship the driver's Python environment to the executors with Spark's own mechanism (a packed "
    "venv through spark.archives, e.g. `--archives env.tar.gz#environment` with "
    "spark.pyspark.python=./environment/bin/python, or PYSPARK_PYTHON=./environment/bin/python "
    "for a session built in Python), or install the same tailguard on every executor host: see "
    "docs/deploy.md"
)


class ExecutorEnvironmentError(RuntimeError):
    """The executors cannot run this job's slot runners: the job fails before it starts."""


def _build() -> str:
    # Uncached, so that the copy shipped by value carries no lru_cache wrapper (which cloudpickle
    # would pickle as a reference to this module, which the executor may lack).
    tailguard = _package()
    root = Path(str(tailguard.__file__)).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return f"{_release(tailguard)}+{digest.hexdigest()[:12]}"


#: `<version>+<digest>` of the tailguard imported here: the release (package metadata, or
#: `__version__` in a source tree) and a SHA-256 prefix over the package's `.py` files, by
#: relative path (~150 files: a few milliseconds, once per process).
tailguard_build = functools.lru_cache(maxsize=1)(_build)


def _package() -> Any:
    # The top-level package, imported by name: a static `import tailguard` would look to the
    # import contracts as if executor code imported the graph API and the entry point, which
    # the package's __init__ loads only on first use.
    return importlib.import_module(PACKAGE)


def _release(package: Any) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(PACKAGE)
    except PackageNotFoundError:  # a source tree on the path, not installed
        return str(getattr(package, "__version__", "0+unknown"))


def _host() -> str:
    # What `attempt.task_host()` reports, without importing it (tailguard may be missing here).
    return os.environ.get("SPARK_LOCAL_IP") or socket.gethostname()


def this_python() -> dict[str, str]:
    """This process's interpreter and tailguard, in the form `describe` reports them."""
    report = {
        "host": _host(),
        "python": sys.executable,
        "python_version": ".".join(str(n) for n in sys.version_info[:3]),
    }
    try:
        importlib.import_module(RUNNER_MODULE)
        report["tailguard"] = _build()
        report["tailguard_path"] = str(Path(str(_package().__file__)).resolve().parent)
    except Exception as err:  # whatever stops a runner from importing: the report says it
        report["error"] = f"{type(err).__name__}: {err}"
    return report


def describe(_items: Iterator[Any]) -> Iterator[dict[str, str]]:
    """`mapPartitions` body of the check: one report per task, from the executor it ran on.

    Shipped by value, so the executor runs this copy; the tailguard it reports on is the one
    the executor's interpreter imports."""
    yield this_python()


def incompatibilities(driver: Mapping[str, str], reports: Iterable[Mapping[str, str]]) -> list[str]:
    """What stops the executors that sent `reports` from running the driver's runners, one line
    per distinct problem and host (empty: they can)."""
    problems: dict[str, None] = {}
    want_python = _minor(driver["python_version"])
    for report in reports:
        where = f"executor {report.get('host', '?')} (python {report.get('python', '?')} " + (
            f"{report.get('python_version', '?')})"
        )
        if "error" in report:
            problems[f"{where} cannot import tailguard: {report['error']}"] = None
            continue
        if report.get("tailguard") != driver.get("tailguard"):
            problems[
                f"{where} runs tailguard {report.get('tailguard')} from "
                f"{report.get('tailguard_path')}, the driver {driver.get('tailguard')}"
            ] = None
        if _minor(report.get("python_version", "")) != want_python:
            problems[
                f"{where} runs Python {report.get('python_version')}, the driver "
                f"{driver['python_version']}: pickled runner code needs the same minor version"
            ] = None
    return list(problems)


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def failure_message(problems: list[str]) -> str:
    return f"the executors cannot run tailguard's slot runners: {'; '.join(problems)}. Fix: {FIX}"
