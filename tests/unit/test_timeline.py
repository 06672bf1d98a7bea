"""The timeline model on the recorded demo and on synthetic histories; the trace and the page."""

from __future__ import annotations

import itertools
import json
import re
import shutil
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.examples_budget import examples
from tests.unit.inspect_records import (
    DEMO_ARCHIVE,
    DEMO_FINDING,
    DEMO_HEAD,
    DEMO_LAUNCH,
    START,
    JobLog,
)

from tailguard.cli import main
from tailguard.inspect.history import HistoryError, history_of
from tailguard.inspect.page import render_page
from tailguard.inspect.reading import archived
from tailguard.inspect.timeline import Bar, Outcome, Timeline, as_data, build_timeline
from tailguard.inspect.timeline_cli import default_output
from tailguard.inspect.trace import SPANS_TID, trace_events
from tailguard.model import records as r
from tailguard.model.config import Settings


@pytest.fixture(scope="module")
def demo() -> Timeline:
    return build_timeline(history_of(archived(str(DEMO_ARCHIVE), Settings())))


def bar(timeline: Timeline, name: str) -> Bar:
    return next(b for b in timeline.bars if f"{b.vertex}#{b.subtask}.{b.attempt}" == name)


# --------------------------------------------------------------------------- the recorded demo


def test_demo_lanes_and_one_bar_per_attempt(demo: Timeline) -> None:
    records = [e.record for e in archived(str(DEMO_ARCHIVE), Settings())]
    deployed = [x for x in records if isinstance(x, r.AttemptDeploying)]
    assert [(lane.host, lane.slot) for lane in demo.lanes] == [
        ("127.0.0.2", 0),
        ("127.0.0.3", 0),
        ("127.0.0.4", 0),
    ]
    assert sorted(b.deploy_id for b in demo.bars) == sorted(d.id for d in deployed)
    assert demo.status == "SUCCEEDED"
    assert demo.end_ms == 43_249


def test_demo_speculative_copy_won_and_the_straggler_lost(demo: Timeline) -> None:
    copy = bar(demo, f"{DEMO_HEAD}#2.1")
    straggler = bar(demo, f"{DEMO_HEAD}#2.0")
    assert copy.speculative and copy.outcome is Outcome.WON and copy.host == "127.0.0.2"
    assert copy.cause.kind == "speculative launch"
    assert copy.cause.command_id == DEMO_LAUNCH
    assert copy.cause.command_type == "LaunchSpeculativeAttempts"
    assert any(DEMO_FINDING in line for line in copy.cause.because)
    assert not straggler.speculative and straggler.outcome is Outcome.LOST_RACE
    assert straggler.end_ms == copy.end_ms
    others = [b for b in demo.bars if b not in (copy, straggler)]
    assert {b.outcome for b in others} == {Outcome.WON}
    # A first attempt names the command that initialised its vertex.
    first = bar(demo, f"{DEMO_HEAD}#0.0")
    assert first.cause.kind == "first deployment"
    assert first.cause.command_type == "SetParallelism"


def test_demo_block_shaded_on_the_slow_host(demo: Timeline) -> None:
    rows = {h.name: h for h in demo.hosts}
    assert not rows["127.0.0.2"].blocked and not rows["127.0.0.3"].blocked
    (block,) = rows["127.0.0.4"].blocked
    # Blocked at NodeBlocked until the job's end: its until_ts (+55.6 s) came after.
    assert (block.start_ms, block.end_ms) == (35_667, 43_249)
    assert "blocklist-ef38aec4d04a7aadd898ca45" in block.record_ids


def test_demo_vertex_phases(demo: Timeline) -> None:
    head, tail = demo.vertices
    assert (head.vertex, head.parallelism, head.decided_by) == (DEMO_HEAD, 7, "decider")
    assert head.operators == ("sales", "score", "partial")
    assert head.done and head.attempts == 8
    assert [(s.start_ms, s.end_ms) for s in head.running] == [(8_597, 43_196)]
    assert (tail.vertex, tail.parallelism, tail.done) == ("final→sink", 1, True)


def test_bars_on_one_lane_never_overlap(demo: Timeline) -> None:
    by_lane = defaultdict(list)
    for b in demo.bars:
        by_lane[b.lane].append((b.start_ms, b.end_ms))
    for spans in by_lane.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), spans


# --------------------------------------------------------------------------- synthetic histories


def test_slots_are_reused_and_overflow_opens_a_lane() -> None:
    log = JobLog()
    log.submitted()
    log.add(r.NodeAdded, 1, host="h1", slots=2)
    log.initialized(2, "src", 4)
    log.deploy(10, "src", 0, 0, "h1")
    log.deploy(10, "src", 1, 0, "h1")
    log.finish(20, "src", 0, 0, "h1")
    log.deploy(20, "src", 2, 0, "h1")  # takes slot 0, freed at the same instant
    log.deploy(25, "src", 3, 0, "h1")  # a third at once on a 2-slot host: an extra lane
    timeline = build_timeline(history_of(log.records))
    lanes = {(b.subtask): timeline.lanes[b.lane].slot for b in timeline.bars}
    assert lanes == {0: 0, 1: 1, 2: 0, 3: 2}
    assert [lane.slot for lane in timeline.lanes] == [0, 1, 2]
    # No end in the archive and no JobFinished: running to the archive's last record.
    assert timeline.status == "RUNNING" and timeline.end_ms == 25
    assert {b.subtask for b in timeline.bars if b.outcome is Outcome.RUNNING} == {1, 2, 3}
    assert all(b.end_ms == 25 for b in timeline.bars if b.outcome is Outcome.RUNNING)


USER = r.ErrorKind.USER


def test_failure_restart_and_cancellation() -> None:
    log = JobLog()
    log.submitted()
    log.add(r.NodeAdded, 1, host="h1", slots=1)
    log.initialized(2, "src", 1)
    log.deploy(10, "src", 0, 0, "h1")
    failed = log.attempt(r.AttemptFailed, 15, "src", 0, 0, "h1", error=USER, message="boom")
    restart = log.add(
        r.RestartTasks,
        15,
        record_id="failover-1",
        caused_by=(failed.id,),
        tasks=(r.TaskRef("src", 0),),
        reason="attempt 0 failed",
        not_before_ts=START + 16,
    )
    log.add(r.CommandApplied, 16, command_id=restart.id, command_type="RestartTasks")
    log.deploy(17, "src", 0, 1, "h1")
    log.attempt(r.AttemptCanceled, 30, "src", 0, 1, "h1", reason=r.CancelReason.JOB_CANCELED)
    log.add(r.JobFinished, 31, status=r.JobStatus.CANCELED)
    timeline = build_timeline(history_of(log.records))
    first, second = timeline.bars
    assert first.outcome is Outcome.FAILED and "USER: boom" in first.detail
    assert second.outcome is Outcome.CANCELED and "JOB_CANCELED" in second.detail
    assert second.cause.kind == "restart" and second.cause.command_id == "failover-1"
    assert any(failed.id in line for line in second.cause.because)
    assert first.cause.kind == "first deployment" and first.cause.command_id is None
    assert timeline.status == "CANCELED"
    (phase,) = [v for v in timeline.vertices if v.vertex == "src"]
    assert not phase.done and phase.attempts == 2


def test_blocks_extend_lift_and_expire_and_absences_are_spans() -> None:
    log = JobLog()
    log.submitted()
    log.add(r.NodeAdded, 1, host="h1", slots=1)
    log.add(r.NodeBlocked, 10, host="h1", until_ts=START + 20)
    log.add(r.NodeBlocked, 15, host="h1", until_ts=START + 40)  # extends the same block
    log.add(r.NodeUnblocked, 30, host="h1")
    log.add(r.NodeBlocked, 50, host="h1", until_ts=START + 60)  # expires without an event
    log.add(r.NodeBlocked, 70, host="h1", until_ts=START + 200)  # a new block; job ends first
    log.add(r.NodeRemoved, 80, host="h1", reason="lost")
    log.add(r.NodeAdded, 90, host="h1", slots=1)
    log.add(r.NodeRemoved, 95, host="h1", reason="lost again")
    log.add(r.JobFinished, 100, status=r.JobStatus.SUCCEEDED)
    (host,) = build_timeline(history_of(log.records)).hosts
    assert [(s.start_ms, s.end_ms) for s in host.blocked] == [(10, 30), (50, 60), (70, 100)]
    assert [(s.start_ms, s.end_ms) for s in host.absent] == [(80, 90), (95, 100)]
    assert host.absent[0].label == "removed: lost"


def test_a_history_is_one_job() -> None:
    with pytest.raises(HistoryError, match="no records"):
        history_of([])
    first, second = JobLog("a"), JobLog("b")
    first.submitted()
    second.submitted()
    records = first.records + second.records
    with pytest.raises(HistoryError, match="2 jobs, choose one: a, b"):
        history_of(records)
    assert history_of(records, "b").job_id == "b"
    with pytest.raises(HistoryError, match="no job 'c'"):
        history_of(records, "c")


# --------------------------------------------------------------------------- trace and page


def test_trace_has_an_event_per_attempt_on_its_host_and_slot(demo: Timeline) -> None:
    trace = json.loads(json.dumps(trace_events(demo)))
    events = trace["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    attempts = [e for e in events if e["ph"] == "X" and e["cat"].startswith("attempt")]
    assert len(attempts) == len(demo.bars)
    for event in attempts:
        assert processes[event["pid"]] == f"host {event['args']['host']}"
        assert event["dur"] >= 0
    (copy,) = [e for e in attempts if "speculative" in e["cat"]]
    assert copy["name"] == f"{DEMO_HEAD}#2.1 (speculative)"
    assert copy["ts"] == 35_653_000 and copy["args"]["outcome"] == "won"
    assert "LaunchSpeculativeAttempts" in copy["args"]["started by"]
    (block,) = [e for e in events if e.get("cat") == "blocked"]
    assert processes[block["pid"]] == "host 127.0.0.4" and block["tid"] == SPANS_TID
    vertices = [e for e in events if e.get("cat") == "vertex"]
    assert {e["name"] for e in vertices} == {DEMO_HEAD, "final→sink"}


def test_page_is_self_contained_and_carries_the_timeline(demo: Timeline) -> None:
    page = render_page(demo)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page), "no network"
    data = re.search(
        r'<script type="application/json" id="timeline-data">(.*?)</script>', page, re.S
    )
    assert data is not None
    assert json.loads(data.group(1)) == json.loads(json.dumps(as_data(demo)))


def test_page_data_cannot_end_its_script_early() -> None:
    log = JobLog()
    log.submitted()
    log.add(r.NodeAdded, 1, host="h1", slots=1)
    log.deploy(10, "</script><script>alert(1)</script>", 0, 0, "h1")
    page = render_page(build_timeline(history_of(log.records)))
    assert "</script><script>alert(1)" not in page
    assert page.count("</script>") == 2


# --------------------------------------------------------------------------- placement property


@st.composite
def lifecycles(draw: st.DrawFn) -> list[r.Record]:
    """Attempts deploying on and ending from 1-3 hosts of 1-3 slots, in time order."""
    log = JobLog()
    log.submitted()
    hosts = {f"h{i}": draw(st.integers(1, 3)) for i in range(draw(st.integers(1, 3)))}
    for at, (host, slots) in enumerate(hosts.items()):
        log.add(r.NodeAdded, at, host=host, slots=slots)
    live: list[tuple[int, str]] = []
    at = 10
    for subtask in range(draw(st.integers(1, 25))):
        at += draw(st.integers(0, 5))
        while live and draw(st.booleans()):
            ended, host = live.pop(draw(st.integers(0, len(live) - 1)))
            log.finish(at, "src", ended, 0, host)
        host = draw(st.sampled_from(sorted(hosts)))
        log.deploy(at, "src", subtask, 0, host)
        live.append((subtask, host))
    return log.records


@given(lifecycles())
@settings(max_examples=examples(60), deadline=None)
def test_placement_never_overlaps_and_keeps_each_bar_on_its_host(records: list) -> None:
    timeline = build_timeline(history_of(records))
    announced = {x.host: x.slots for x in records if isinstance(x, r.NodeAdded)}
    by_lane = defaultdict(list)
    for b in timeline.bars:
        assert timeline.lanes[b.lane].host == b.host
        by_lane[b.lane].append((b.start_ms, b.end_ms))
    for spans in by_lane.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), spans
    for host in timeline.hosts:
        # Lanes beyond the announced slots only when more attempts ran there at once.
        assert len(host.lanes) >= announced[host.name]


def test_timeline_written_next_to_a_local_archive_or_here_for_a_uri(tmp_path: Path) -> None:
    archive = tmp_path / "job.avro"
    shutil.copy(DEMO_ARCHIVE, archive)
    assert main(["timeline", archive.as_uri()]) == 0  # file:///.../job.avro
    assert (tmp_path / "job.html").read_text().startswith("<!DOCTYPE html>")
    assert default_output("s3://bucket/archive/job.avro", "trace") == Path("job.trace.json")


@pytest.mark.parametrize(("other", "fused"), [("large", True), ("mid", False)])
def test_a_broadcast_joins_other_side_without_attempts_ran_inside_it_only_if_fused(
    other: str, fused: bool
) -> None:
    """A source with no attempt of its own ran inside its broadcast join; a vertex reading
    another's output is written unshuffled, never fused, so with no attempt it just never ran
    (a job failed before it): the timeline applies the agent's rule (`other_side`)."""
    log = JobLog()
    edges = [r.EdgeSpec("dims", "join", r.Distribution.ALL_TO_ALL, index=1)]
    vertices = [r.VertexSpec(v, r.VertexKind.SOURCE) for v in ("large", "dims")]
    if other == "mid":
        vertices.append(r.VertexSpec("mid", r.VertexKind.OPERATOR))
        edges.append(r.EdgeSpec("large", "mid", r.Distribution.FORWARD))
    edges.append(r.EdgeSpec(other, "join", r.Distribution.ALL_TO_ALL))
    vertices.append(r.VertexSpec("join", r.VertexKind.OPERATOR))
    graph = r.JobGraphSpec(vertices=tuple(vertices), edges=tuple(edges))
    log.add(r.JobSubmitted, 0, name="job", graph=graph, config={})
    for vertex in ("large", "dims", *(("mid",) if other == "mid" else ())):
        log.initialized(10, vertex, 1)
    ranges = (r.InputRange(other, 0, 0, 0, 0), r.InputRange("dims", 0, 0, 0, 0))
    log.add(
        r.SetParallelism,
        20,
        vertex="join",
        parallelism=1,
        subtask_inputs=(r.SubtaskInputs(0, ranges),),
        broadcast=r.BroadcastJoin("dims", "right", 10, 1024),
    )
    phases = {p.vertex: p for p in build_timeline(history_of(log.records)).vertices}
    assert phases[other].decided_by.endswith("; ran inside join") is fused
