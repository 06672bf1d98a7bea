"""The chaos suite's report: every case adds its `CaseResult` to `chaos_report`; at the end of
the run the table is printed, and when the run included cases marked `chaos` (`make chaos`) it is
written to build/chaos/report.json with the machine's load, for docs/reliability.md."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.chaos.toolkit import CaseResult

REPORT = Path("build/chaos/report.json")
_RESULTS: list[CaseResult] = []
_KEY = pytest.StashKey[bool]()


@pytest.fixture
def chaos_report(request: pytest.FixtureRequest) -> Iterator[list[CaseResult]]:
    """Append the case's result; it is reported whatever the test's outcome."""
    if request.node.get_closest_marker("chaos") is not None:
        request.config.stash[_KEY] = True
    yield _RESULTS


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "**no**"
    return str(value).replace("|", "/")


def table(results: list[CaseResult]) -> str:
    """The Markdown table of the cases (the one docs/reliability.md shows)."""
    head = [
        "case",
        "job",
        "exact output",
        "replay differences",
        "applied twice",
        "faults",
        "recover (s)",
        "job (s)",
        "targets",
        "note",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for result in results:
        missed = result.missed()
        cells = [
            result.case,
            result.outcome,
            result.exact,
            result.replay_differences,
            result.applied_twice,
            result.faults,
            result.recover_s,
            result.job_s,
            "met" if not missed else "missed: " + ", ".join(missed),
            result.note,
        ]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if not _RESULTS:
        return
    terminalreporter.section("chaos cases")
    terminalreporter.write_line(table(_RESULTS))
    if not config.stash.get(_KEY, False):
        return
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "load_average": os.getloadavg(),
        "cases": [result.row() for result in _RESULTS],
    }
    REPORT.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    terminalreporter.write_line(f"written to {REPORT}")
