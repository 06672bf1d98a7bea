"""Acceptance: a job's timeline drawn by a real headless browser (Chromium), and what it drew.

The page draws itself with its own script, so `chromium --headless --dump-dom` (which runs the
script) shows the SVG it made. The expected lanes, bars, speculative copy and block are taken
from the archive's records here, not from the timeline model under test.

- The recorded demo (a real `make demo` run, tests/unit/recorded/) in the default suite.
- A fresh short job on the local stack (broker, 3-worker cluster, the five services) whose first
  attempt of one subtask stalls until cancelled: the real detector flags it, the speculator
  launches a copy that wins, the blocklist blocks its host. Marked spark and slow.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from tests.unit.inspect_records import DEMO_ARCHIVE

from tailguard.cli import main
from tailguard.demo import DEMO_POLICY
from tailguard.inspect.reading import archived
from tailguard.model import records as r
from tailguard.model.config import Settings

# Long (make test-long); make test keeps the shorter cases of the same feature.
pytestmark = pytest.mark.long

CHROMIUM = next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium: apt-get install -y chromium"
)
BROWSER_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
WINDOW = (1400, 330)


def chromium(*args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run(
        [CHROMIUM, *BROWSER_FLAGS, *args], capture_output=True, text=True, timeout=120
    )


@dataclass
class Drawn:
    """The elements of the dumped DOM, by tag, with their attributes."""

    elements: list[tuple[str, dict[str, str]]] = field(default_factory=list)

    def of(self, tag: str, cls: str) -> list[dict[str, str]]:
        return [a for t, a in self.elements if t == tag and cls in a.get("class", "").split()]


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.drawn = Drawn()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.drawn.elements.append((tag, {k: v or "" for k, v in attrs}))


def draw(archive: Path, tmp: Path) -> Drawn:
    page = tmp / "timeline.html"
    assert main(["timeline", str(archive), "-o", str(page)]) == 0
    done = chromium("--dump-dom", page.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    collector = _Collector()
    collector.feed(done.stdout)
    return collector.drawn


def attempt_name(e: Any) -> str:
    return f"{e.vertex}#{e.subtask}.{e.attempt}"


def check_drawing(drawn: Drawn, records: list[r.Record]) -> None:
    """Lanes, one bar per attempt with its outcome, the speculative copies and the blocks."""
    (body,) = [a for t, a in drawn.elements if t == "body"]
    assert body.get("data-rendered") == "true", "the page's script did not finish"

    slots: dict[str, int] = {}
    for e in records:
        if isinstance(e, r.NodeAdded):
            slots[e.host] = max(slots.get(e.host, 0), e.slots)
    lanes = {(a["data-host"], a["data-slot"]) for a in drawn.of("g", "lane")}
    assert {(h, str(s)) for h, n in slots.items() for s in range(n)} <= lanes

    deployed = {attempt_name(e): e for e in records if isinstance(e, r.AttemptDeploying)}
    outcome = {name: "running" for name in deployed}
    for e in records:
        if isinstance(e, r.AttemptFinished):
            outcome[attempt_name(e)] = "won"
        elif isinstance(e, r.AttemptFailed):
            outcome[attempt_name(e)] = "failed"
        elif isinstance(e, r.AttemptCanceled):
            lost = e.reason is r.CancelReason.LOST_RACE
            outcome[attempt_name(e)] = "lost the race" if lost else "cancelled"
    bars = {a["data-attempt"]: a for a in drawn.of("rect", "bar")}
    assert len(drawn.of("rect", "bar")) == len(deployed)
    assert {name: a["data-outcome"] for name, a in bars.items()} == outcome
    assert {name: a["data-host"] for name, a in bars.items()} == {
        name: e.host for name, e in deployed.items()
    }

    speculative = {name for name, e in deployed.items() if e.speculative}
    assert speculative, "the archive has no speculative attempt"
    assert {n for n, a in bars.items() if "speculative" in a["class"].split()} == speculative
    assert {n for n, a in bars.items() if a["data-speculative"] == "true"} == speculative

    blocked_hosts = {e.host for e in records if isinstance(e, r.NodeBlocked)}
    assert blocked_hosts, "the archive has no block"
    blocks = drawn.of("rect", "block")
    assert {a["data-host"] for a in blocks} == blocked_hosts
    # Drawn where it happened: a block starts after the first attempt on its host did.
    for block in blocks:
        first = min(
            (a for a in bars.values() if a["data-host"] == block["data-host"]),
            key=lambda a: float(a["x"]),
        )
        assert float(first["x"]) < float(block["x"])


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@needs_chromium
def test_recorded_demo_timeline_in_chromium(tmp_path: Path) -> None:
    drawn = draw(DEMO_ARCHIVE, tmp_path)
    records = [e.record for e in archived(str(DEMO_ARCHIVE), Settings())]
    check_drawing(drawn, records)
    # The demo's own facts, as the docs describe them.
    (copy,) = [a for a in drawn.of("rect", "bar") if a["data-speculative"] == "true"]
    assert (copy["data-attempt"], copy["data-host"], copy["data-outcome"]) == (
        "sales→score→partial#2.1",
        "127.0.0.2",
        "won",
    )
    assert [a["data-host"] for a in drawn.of("rect", "block")] == ["127.0.0.4"]
    shot = tmp_path / "timeline.png"
    done = chromium(
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        f"--screenshot={shot}",
        (tmp_path / "timeline.html").as_uri(),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert png_size(shot) == WINDOW


# --------------------------------------------------------------------------- a fresh run

SLOW_S = 120.0  # how long the straggler would stall if nobody cancelled it


def straggler(marker: str) -> Callable[[Any], Any]:
    """The sales example's score and partial sums, but the first attempt to read order 0
    stalls (in a cancellable wait, as I/O-bound work would) until it is cancelled; a copy runs
    at once."""
    from tailguard.examples import sales_by_region

    def partial(table: Any) -> Any:
        import pyarrow.compute as pc

        from tailguard.agent.executor import control

        if pc.min(table["order_id"]).as_py() == 0:
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass  # the copy
            else:
                control.wait(SLOW_S)
        return sales_by_region.partial_sums(sales_by_region.score(table))

    return partial


@pytest.mark.spark
@pytest.mark.slow
@needs_chromium
@pytest.mark.tailguard_cluster(workers=3)
# The demo's policy: 1.5 s lower bound, block on one slow task.
@pytest.mark.tailguard_services(settings=DEMO_POLICY)
def test_fresh_job_timeline_in_chromium(
    tailguard_spark: Any, tailguard_services: Any, tmp_path: Path
) -> None:
    from tailguard.agent.graph.api import Job
    from tailguard.examples import sales_by_region
    from tailguard.testing import run_job

    work = tmp_path / "work"
    work.mkdir()
    # Four splits on three one-slot hosts: the detector looks once 3 of 4 (75%) have finished.
    data = sales_by_region.generate(work / "data", files=2, rows_per_file=2_000)
    job = Job("timeline-acceptance")
    sales = job.read_parquet(str(data), name="sales", parallelism=4)
    partial = sales.map(straggler(str(tmp_path / "straggler")), name="partial")
    totals = partial.partition_by("region").map(sales_by_region.final_sums, name="final")
    totals.write_parquet(str(work / "out"), name="sink")
    job_run = run_job(job, tailguard_spark, work, services=tailguard_services)
    result, settings = job_run.result, job_run.settings
    assert result.ok, result.summary()
    archive = Path(result.archive)
    records = [e.record for e in archived(str(archive), settings)]
    check_drawing(draw(archive, tmp_path), records)
    trace = tmp_path / "timeline.trace.json"
    assert main(["timeline", str(archive), "--format", "trace", "-o", str(trace)]) == 0
    assert trace.stat().st_size > 0
