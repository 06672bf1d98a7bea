"""A recovered job's log in `inspect`: the JobRecovered marker is a line in words, a mark on the
timeline and the trace, the cause of the re-run attempts and of the lost attempts' ends."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_fakes import run_all
from test_agent_recovery import F, P, crash_mid_job, recovering

from tailguard.inspect.describe import describe
from tailguard.inspect.explain import explain
from tailguard.inspect.history import History, history_of
from tailguard.inspect.page import render_page
from tailguard.inspect.timeline import Outcome, build_timeline
from tailguard.inspect.trace import trace_events
from tailguard.model import records as r


@pytest.fixture(scope="module")
def recovered(tmp_path_factory: pytest.TempPathFactory) -> History:
    """The combined log of a job whose driver died with final#1 running, then was recovered."""
    tmp_path: Path = tmp_path_factory.mktemp("recovered")
    job, events, storage = crash_mid_job(tmp_path)
    h = recovering(job, events, storage)
    assert run_all(h.start()).ok
    return history_of([*events, *h.publisher.events])


def _marker(history: History) -> r.JobRecovered:
    (marker,) = [e for e in history.records if isinstance(e, r.JobRecovered)]
    return marker


def test_the_marker_reads_as_one_line(recovered: History) -> None:
    marker = _marker(recovered)
    line = describe(marker, recovered.start_ts)
    assert line.startswith("driver recovered: kept 4 results (2 sink parts), re-ran 1 attempt;")
    assert f"event {marker.last_sequence}" in line and "replaces the run begun by job-e1" in line
    assert "lost" not in line  # nothing was lost


def test_the_timeline_marks_the_takeover_and_names_it_as_the_rerun_cause(
    recovered: History,
) -> None:
    timeline = build_timeline(recovered)
    marker = _marker(recovered)
    (mark,) = timeline.marks
    assert (mark.at_ms, mark.record_id) == (marker.ts - recovered.start_ts, marker.id)
    assert mark.label == describe(marker, recovered.start_ts)
    lost = next(b for b in timeline.bars if (b.vertex, b.subtask, b.attempt) == (F, 1, 0))
    assert lost.outcome is Outcome.CANCELED
    rerun = next(b for b in timeline.bars if (b.vertex, b.subtask, b.attempt) == (F, 1, 1))
    assert rerun.outcome is Outcome.WON
    assert rerun.cause.kind == "recovery" and rerun.cause.summary.startswith("JobRecovered")
    first = next(b for b in timeline.bars if (b.vertex, b.subtask, b.attempt) == (P, 0, 0))
    assert first.cause.kind == "first deployment"
    trace = trace_events(timeline)["traceEvents"]
    (instant,) = [e for e in trace if e["ph"] == "i"]
    assert (instant["s"], instant["ts"], instant["args"]) == (
        "g",
        mark.at_ms * 1000,
        {"event": marker.id},
    )
    assert '"marks": [{"at_ms"' in render_page(timeline)


def test_explain_leads_a_lost_attempts_end_to_the_takeover(recovered: History) -> None:
    canceled = next(
        e
        for e in recovered.records
        if isinstance(e, r.AttemptCanceled) and (e.vertex, e.subtask, e.attempt) == (F, 1, 0)
    )
    steps = explain(recovered, canceled).root.steps
    assert ("reset by the driver's recovery", _marker(recovered).id) in [
        (s.via, s.record_id) for s in steps
    ]
