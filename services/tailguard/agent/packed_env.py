"""A packed Python environment for executors on other hosts: this tailguard and what its
executor code needs, in a venv packed with `venv-pack`, for Spark to ship with `spark.archives`
(docs/deploy.md has the recipe for a real cluster; this builds one for the namespace lab). It
lives with the agent, whose executor code it packs and whose build it names, not with the local
cluster, which sits below the agent.

Building is slow, so both steps are cached under `cache_dir`:

1. the dependencies' venv, keyed by a hash of the Python and of the versions pinned from the
   running environment (`pip freeze`): `deps-<key>/`, built once per dependency change
   (measured: venv + pip install from the local cache ~50 s, 355 MB);
2. the archive, keyed by that hash and this tailguard's build (`environment.tailguard_build`):
   `env-<key>-<build>.tar.gz`. A code change rebuilds only this: a wheel of the source tree
   (~20 s, an isolated build), installed into the cached venv, then packed (~13 s, 124 MB at
   gzip level 1). Older archives of the same venv are removed.

The archive's `bin/python` links to the base interpreter by its absolute path (venv-pack does
not ship Python itself), so the executor hosts need the same Python at the same place: true of
the namespace lab, which shares this machine's file system; on a real cluster use the same
image, or conda-pack (docs/deploy.md).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from tailguard.agent.executor.environment import tailguard_build

# What executor code imports beyond tailguard's own dependencies: pandas for `map_pandas` and
# the examples. pyspark is not shipped: executors put their Spark's own `python/lib/pyspark.zip`
# on the workers' path.
EXECUTOR_REQUIREMENTS = ("pandas",)
PACKER = "venv-pack"


class PackError(RuntimeError):
    """The environment could not be built or packed (the message names the step and its log)."""


def _run(argv: list[str], what: str, log: Path) -> None:
    with log.open("ab") as out:
        out.write(f"$ {' '.join(argv)}\n".encode())
        out.flush()
        done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise PackError(f"{what} failed (exit {done.returncode}); see {log}")


def source_tree() -> Path:
    """The checkout tailguard runs from (where its pyproject.toml is)."""
    # services/tailguard/agent/packed_env.py -> the checkout; not `import tailguard`, whose
    # package file reaches up to observe and attach mode (the layers contract).
    root = Path(__file__).resolve().parents[3]
    if not (root / "pyproject.toml").is_file():
        raise PackError(
            f"tailguard is not running from a source checkout ({root} has no pyproject.toml): "
            "pack the environment the deployment docs describe instead"
        )
    return root


def pinned_requirements() -> str:
    """The running environment's versions, as pip constraints (tailguard itself excluded)."""
    frozen = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--exclude-editable"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return "".join(
        f"{line}\n"
        for line in sorted(frozen.splitlines())
        if line and not line.lower().startswith(("tailguard", "-e "))
    )


def packed_environment(
    cache_dir: Path, progress: Callable[[str], None] = lambda _message: None
) -> Path:
    """The packed archive for this tailguard, built if not cached (see the module doc)."""
    cache_dir = Path(cache_dir).resolve()
    cache_dir.mkdir(parents=True, exist_ok=True)
    constraints = pinned_requirements()
    deps_key = hashlib.sha256(
        "\n".join(
            [sys.version, sys.base_prefix, constraints, *EXECUTOR_REQUIREMENTS, PACKER]
        ).encode()
    ).hexdigest()[:12]
    build = tailguard_build().replace("+", "-")
    archive = cache_dir / f"env-{deps_key}-{build}.tar.gz"
    if archive.is_file():
        progress(f"packed environment cached: {archive}")
        return archive
    log = cache_dir / "pack.log"
    venv = cache_dir / f"deps-{deps_key}"
    python = venv / "bin" / "python"
    if not (venv / ".complete").is_file():
        progress(f"building the executors' venv {venv} (once per dependency change)")
        shutil.rmtree(venv, ignore_errors=True)
        (cache_dir / "constraints.txt").write_text(constraints)
        _run([sys.executable, "-m", "venv", str(venv)], "creating the venv", log)
        _run(
            [
                str(python), "-m", "pip", "install", "--quiet",
                "-c", str(cache_dir / "constraints.txt"),
                *EXECUTOR_REQUIREMENTS, PACKER,
            ],
            "installing the executor requirements",
            log,
        )  # fmt: skip
        (venv / ".complete").write_text(constraints)
    progress(f"installing tailguard {tailguard_build()} into {venv.name} and packing it")
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        _run(
            [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", tmp,
             str(source_tree())],
            "building the tailguard wheel",
            log,
        )  # fmt: skip
        (wheel,) = Path(tmp).glob("tailguard-*.whl")
        # The wheel brings its own dependencies, pinned like the driver's.
        _run(
            [str(python), "-m", "pip", "install", "--quiet", "--force-reinstall", "--no-deps",
             str(wheel)],
            "installing the tailguard wheel",
            log,
        )  # fmt: skip
        _run(
            [str(python), "-m", "pip", "install", "--quiet",
             "-c", str(cache_dir / "constraints.txt"), str(wheel)],
            "installing tailguard's dependencies",
            log,
        )  # fmt: skip
    shipped = subprocess.run(
        [str(python), "-c", "from tailguard.agent.executor.environment import tailguard_build;"
         " print(tailguard_build())"],
        capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    if shipped != tailguard_build():
        raise PackError(
            f"the venv's tailguard is {shipped or 'not importable'}, this one "
            f"{tailguard_build()}: the source tree changed while packing?"
        )
    for old in cache_dir.glob(f"env-{deps_key}-*.tar.gz"):
        old.unlink()
    partial = archive.with_suffix(".partial")
    _run(
        [str(venv / "bin" / PACKER), "--prefix", str(venv), "--output", str(partial),
         "--format", "tar.gz", "--compress-level", "1", "--force", "--quiet"],
        "packing the venv",
        log,
    )  # fmt: skip
    partial.replace(archive)
    progress(f"packed {archive} ({archive.stat().st_size / 1e6:.0f} MB)")
    return archive
