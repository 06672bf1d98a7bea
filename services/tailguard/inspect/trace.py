"""The timeline as Chrome trace events, for Perfetto (ui.perfetto.dev) and chrome://tracing. Pure.

The Trace Event Format's JSON object form: a process per host with a thread per slot (one
complete event "X" per attempt), a "blocked / removed" thread on each host for its spans (on a
thread of their own, since events on one thread must nest), and a "job" process with a thread
per vertex for its running spans; a driver's takeover is a global instant event ("i", scope
"g"). Times are microseconds after the job's start.
"""

from __future__ import annotations

from typing import Any

from tailguard.inspect.history import attempt_name
from tailguard.inspect.timeline import Bar, Outcome, Span, Timeline

# Chrome's reserved colour names (`cname`); Perfetto picks its own colours by name.
_COLOURS = {
    Outcome.WON: "good",
    Outcome.LOST_RACE: "grey",
    Outcome.FAILED: "terrible",
    Outcome.CANCELED: "yellow",
    Outcome.RUNNING: "generic_work",
}
JOB_PID = 0
SPANS_TID = 10_000  # the host thread that carries blocked and removed spans, after the slots


def _us(ms: int) -> int:
    return ms * 1000


def _meta(name: str, pid: int, tid: int | None, value: Any) -> dict[str, Any]:
    event: dict[str, Any] = {"ph": "M", "name": name, "pid": pid, "args": value}
    if tid is not None:
        event["tid"] = tid
    return event


def _complete(
    name: str, pid: int, tid: int, start_ms: int, end_ms: int, cat: str, args: dict[str, Any]
) -> dict[str, Any]:
    return {
        "ph": "X",
        "name": name,
        "cat": cat,
        "pid": pid,
        "tid": tid,
        "ts": _us(start_ms),
        "dur": _us(max(end_ms - start_ms, 0)),
        "args": args,
    }


def _attempt_args(bar: Bar) -> dict[str, Any]:
    args: dict[str, Any] = {
        "outcome": bar.outcome.value,
        "speculative": bar.speculative,
        "host": bar.host,
        "deploy event": bar.deploy_id,
        "end event": bar.end_id,
        "started by": f"{bar.cause.kind}: {bar.cause.summary}",
    }
    if bar.cause.because:
        args["because"] = list(bar.cause.because)
    if bar.input_bytes is not None:
        args["input bytes"] = bar.input_bytes
    if bar.records is not None:
        args["records"] = bar.records
    if bar.output_bytes is not None:
        args["output bytes"] = bar.output_bytes
    if bar.detail:
        args["detail"] = bar.detail
    return args


def _span(span: Span, pid: int, tid: int, cat: str) -> dict[str, Any]:
    args = {"records": list(span.record_ids)}
    return _complete(span.label, pid, tid, span.start_ms, span.end_ms, cat, args)


def trace_events(timeline: Timeline) -> dict[str, Any]:
    """The trace as JSON-ready data."""
    events: list[dict[str, Any]] = [
        _meta("process_name", JOB_PID, None, {"name": f"job {timeline.name} ({timeline.status})"}),
        _meta("process_sort_index", JOB_PID, None, {"sort_index": 0}),
    ]
    for tid, phase in enumerate(timeline.vertices):
        events.append(_meta("thread_name", JOB_PID, tid, {"name": f"vertex {phase.vertex}"}))
        args = {
            "parallelism": phase.parallelism,
            "decided by": phase.decided_by,
            "operators": list(phase.operators),
            "attempts": phase.attempts,
            "done": phase.done,
        }
        for span in phase.running:
            events.append(
                _complete(phase.vertex, JOB_PID, tid, span.start_ms, span.end_ms, "vertex", args)
            )
    pid_of: dict[str, int] = {}
    for index, host in enumerate(timeline.hosts, start=1):
        pid_of[host.name] = index
        events += [
            _meta("process_name", index, None, {"name": f"host {host.name}"}),
            _meta("process_sort_index", index, None, {"sort_index": index}),
            _meta("thread_name", index, SPANS_TID, {"name": "blocked / removed"}),
        ]
        for lane in host.lanes:
            slot = timeline.lanes[lane].slot
            events.append(_meta("thread_name", index, slot, {"name": f"slot {slot}"}))
        events += [_span(s, index, SPANS_TID, "blocked") for s in host.blocked]
        events += [_span(s, index, SPANS_TID, "removed") for s in host.absent]
    for bar in timeline.bars:
        name = attempt_name(bar.vertex, bar.subtask, bar.attempt)
        if bar.speculative:
            name += " (speculative)"
        cat = ",".join(["attempt", bar.outcome.name.lower(), *(["speculative"] * bar.speculative)])
        event = _complete(
            name,
            pid_of[bar.host],
            timeline.lanes[bar.lane].slot,
            bar.start_ms,
            bar.end_ms,
            cat,
            _attempt_args(bar),
        )
        event["cname"] = _COLOURS[bar.outcome]
        events.append(event)
    for mark in timeline.marks:
        events.append(
            {
                "ph": "i",
                "s": "g",
                "name": mark.label,
                "cat": "recovery",
                "pid": JOB_PID,
                "tid": 0,
                "ts": _us(mark.at_ms),
                "args": {"event": mark.record_id},
            }
        )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"job_id": timeline.job_id, "start_ts_ms": timeline.start_ts},
    }
