"""Packaging, fast checks: the services install and run without pyspark.

The extras' dependency sets are read from `pyproject.toml` and closed over the installed
distributions' own metadata (the dev venv has every extra installed), so no index is asked. The
services' import path is imported in a fresh interpreter and its `sys.modules` inspected.
`tests/packaging/` does the real thing, a fresh venv with `pip install '.[services]'`
(`make test-packaging`).
"""

from __future__ import annotations

import importlib.metadata as md
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tailguard.extras import EXTRA_MODULES, extra_providing

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# Modules only the `spark` extra installs: none may be imported on the services' path.
SPARK_ONLY = ("pyspark", "py4j", "numpy", "pandas", "tqdm")
# ... but pyarrow (base) imports numpy whenever it is installed, and does without it otherwise:
# numpy may be in `sys.modules` here (the dev venv has it), the others may not.
NEVER_IMPORTED = tuple(m for m in SPARK_ONLY if m != "numpy")


def _requirements(extras: set[str]) -> list[Requirement]:
    """The project's own requirements for the base install plus `extras`, self-references
    (`tailguard[services,spark]`) expanded."""
    reqs = [Requirement(text) for text in PROJECT["dependencies"]]
    seen: set[str] = set()
    todo = list(extras)
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        if extra not in PROJECT["optional-dependencies"]:
            raise AssertionError(f"pyproject.toml has no extra {extra!r}")
        seen.add(extra)
        for text in PROJECT["optional-dependencies"][extra]:
            req = Requirement(text)
            if canonicalize_name(req.name) == "tailguard":
                todo.extend(req.extras)
            else:
                reqs.append(req)
    return reqs


def _closure(extras: set[str]) -> set[str]:
    """Canonical names of every distribution the install pulls in, transitively."""
    found: set[str] = set()
    todo = [(req, "") for req in _requirements(extras)]
    while todo:
        req, wanted_by = todo.pop()
        # A dependency's marker may ask for one of the extras it was required with.
        environments = [{"extra": e} for e in (req.extras or {""})]
        if req.marker is not None and not any(req.marker.evaluate(env) for env in environments):
            continue
        name = canonicalize_name(req.name)
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            pytest.fail(f"{req} (needed by {wanted_by or 'tailguard'}) is not installed here")
        if name in found:
            continue
        found.add(name)
        for text in dist.requires or []:
            sub = Requirement(text)
            if sub.marker is None or any(
                sub.marker.evaluate({"extra": e}) for e in (req.extras or {""})
            ):
                todo.append((Requirement(str(sub).split(";")[0]), name))
    return found


def test_services_install_pulls_no_pyspark() -> None:
    pulled = _closure({"services"})
    assert {"faust-streaming", "confluent-kafka", "fastavro"} <= pulled
    assert not pulled & {canonicalize_name(m) for m in SPARK_ONLY}, sorted(pulled)


def test_spark_extra_brings_pyspark_35_and_4() -> None:
    assert "pyspark" in _closure({"spark"})
    (spec,) = [r.specifier for r in _requirements({"spark"}) if r.name == "pyspark"]
    for supported in ("3.5.0", "3.5.9", "4.0.0", "4.3.0"):
        assert Version(supported) in spec, f"pyspark {supported} excluded by {spec}"
    assert Version("3.4.4") not in spec


def test_all_and_dev_cover_every_extra() -> None:
    every = _closure({"services", "spark"})
    assert _closure({"all"}) == every
    assert every <= _closure({"dev"})


def test_extras_table_names_the_modules_each_extra_installs() -> None:
    """`tailguard.extras` turns a missing module into the extra to install: its table must say
    what pyproject.toml's extras really install."""
    providers = {
        module: {canonicalize_name(d) for d in dists}
        for module, dists in md.packages_distributions().items()
    }
    base = {str(r) for r in _requirements(set())}
    for extra, modules in EXTRA_MODULES.items():
        pulled = _closure({extra}) - _closure(set())
        for module in modules:
            assert providers.get(module, set()) & pulled, f"{extra} does not install {module}"
        for req in _requirements({extra}):
            if str(req) in base:
                continue
            tops = {m for m, ds in providers.items() if canonicalize_name(req.name) in ds}
            assert tops & set(modules), f"{req.name} ({extra}) provides {tops}, none listed"
    assert extra_providing("pyspark.sql") == "spark"
    assert extra_providing("faust") == "services"
    assert extra_providing("fastavro") is None


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_services_path_imports_no_spark_module(tmp_path: Path) -> None:
    """Every module of the services, the Kafka clients, the broker operations, the archive,
    the codecs, replay and inspect, and the CLI's dispatch of their commands, in a fresh
    interpreter: none imports pyspark."""
    result = _python(
        f"""
        import importlib, pkgutil, sys
        import tailguard
        from tailguard.cli import build_parser, main
        from tailguard.shell import services_cli
        packages = ["shell", "kafka", "broker", "archive", "codec", "replay", "inspect", "model",
                    "detector", "speculator", "blocklist", "decider", "failover"]
        for name in packages:
            package = importlib.import_module(f"tailguard.{{name}}")
            for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
                importlib.import_module(info.name)
        for command in ("services", "broker", "replay", "timeline", "explain", "export"):
            try:
                main([command, "--help"])
            except SystemExit:
                pass
        assert main(["services", "status", "--work-dir", {str(tmp_path)!r}]) == 1
        print(sorted(m for m in sys.modules if m.split(".")[0] in {NEVER_IMPORTED!r}))
        print(len([m for m in sys.modules if m.startswith("tailguard.shell.worker")]))
        """
    )
    assert result.returncode == 0, result.stderr
    spark_modules, workers = result.stdout.strip().splitlines()[-2:]
    assert spark_modules == "[]"
    assert workers == "1"  # the walk did reach the services' worker (and with it faust)


# Imports of these modules fail, as if the extra was not installed.
_WITHOUT = """
import sys
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {absent!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, Absent())
from tailguard.cli import main
sys.exit(main({argv!r}))
"""


@pytest.mark.parametrize(
    ("absent", "argv", "extra"),
    [
        (SPARK_ONLY, ["run", "examples/no_such_job.py"], "spark"),
        (SPARK_ONLY, ["demo", "--work-dir", "WORK"], "spark"),
        (SPARK_ONLY, ["cluster", "--work-dir", "WORK", "up"], "spark"),
        (("faust", "prometheus_client"), ["services", "up", "--work-dir", "WORK"], "services"),
    ],
)
def test_command_without_its_extra_names_the_install(
    absent: tuple[str, ...], argv: list[str], extra: str, tmp_path: Path
) -> None:
    argv = [str(tmp_path) if a == "WORK" else a for a in argv]
    result = _python(_WITHOUT.format(absent=absent, argv=argv))
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert f"pip install 'tailguard[{extra}]'" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "services").exists()  # nothing was started


def test_services_run_without_spark_modules(tmp_path: Path) -> None:
    """The services' CLI commands work with the spark extra's modules absent."""
    result = _python(
        _WITHOUT.format(absent=SPARK_ONLY, argv=["services", "status", "--work-dir", str(tmp_path)])
    )
    assert result.returncode == 1, result.stderr  # 1: not running, which is the truth here
    assert "detector: not running" in result.stdout


def _dockerfile_stages() -> dict[str, str]:
    """Stage name -> its instructions, from compose/Dockerfile."""
    stages: dict[str, str] = {}
    name = ""
    for line in (ROOT / "compose" / "Dockerfile").read_text().splitlines():
        if line.startswith("FROM "):
            name = line.split(" AS ")[-1].strip() if " AS " in line else line
            stages[name] = ""
        elif name and not line.startswith("#"):
            stages[name] += line + "\n"
    return stages


def test_container_images_follow_the_roles() -> None:
    """The services' image installs tailguard[services] and no JDK; the Spark daemons' image
    brings the JDK and tailguard[spark]; compose builds each role from its stage."""
    import yaml

    stages = _dockerfile_stages()
    assert "'.[services]'" in stages["services"] and "jdk" not in stages["services"]
    assert "'.[spark]'" in stages["spark"] and "openjdk-17-jdk" in stages["spark"]
    compose = yaml.safe_load((ROOT / "compose" / "docker-compose.yml").read_text())["services"]
    for name, service in compose.items():
        if name in ("kafka", "prometheus", "pushgateway", "grafana"):  # their own images
            continue
        role = "spark" if name.startswith("spark-") else "services"
        assert service["build"]["target"] == role, name
