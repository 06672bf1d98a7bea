"""Which pip extra brings which third-party module, and the error that names the missing one.

The base install runs the log, the codecs and replay; `tailguard[services]` adds the services and
`tailguard[spark]` the agent (pyspark, and with it a JDK). A command that reaches a module of an
extra that is not installed fails with the `pip install` line that fixes it, not a traceback.
This table must name the modules of the extras in `pyproject.toml` (tests/unit/test_packaging.py
checks it against the installed metadata).
"""

from __future__ import annotations

import importlib.util
import sys

# extra -> the top-level modules it installs that tailguard imports
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "services": ("faust", "prometheus_client"),
    # prometheus_client is in both: the agent's per-job metrics.
    "spark": ("pyspark", "py4j", "numpy", "pandas", "tqdm", "prometheus_client"),
}


class MissingExtraError(ModuleNotFoundError):
    """A module of an extra is not installed (found missing before anything imported it)."""


def extra_providing(module: str) -> str | None:
    """The extra that installs top-level `module` (or one of its submodules), if any."""
    root = module.partition(".")[0]
    return next((extra for extra, mods in EXTRA_MODULES.items() if root in mods), None)


def missing_extra(err: ModuleNotFoundError, what: str) -> str | None:
    """The clear message for an import that failed because an extra is missing, or None when
    the module belongs to no extra (then it is some other problem, and the traceback helps)."""
    module = (err.name or "").partition(".")[0]
    extra = extra_providing(module)
    if extra is None:
        return None
    return f"{what} needs {module}, which is not installed: pip install 'tailguard[{extra}]'"


def require(extra: str) -> None:
    """Raise MissingExtraError if a module of `extra` is not installed, before a process that
    needs it is started. Looks the modules up without importing them (importing pyspark alone
    takes about a second)."""
    for module in EXTRA_MODULES[extra]:
        # Already imported: installed. (find_spec would raise here for faust, whose module
        # object replaces itself and has no __spec__.)
        if module in sys.modules:
            continue
        if importlib.util.find_spec(module) is None:
            raise MissingExtraError(f"No module named {module!r}", name=module)
