"""One line in words for each record type, shared by the timeline's details and `explain`.

Pure. Times are shown relative to the job's start (`+12.345 s`), as the timeline's axis is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any

from tailguard.inspect.history import attempt_name
from tailguard.model import records as r

COMMON_FIELDS = frozenset({"job_id", "ts", "id", "caused_by"})


def relative(ts: int, start_ts: int) -> str:
    """`+12.345 s` after the job's start."""
    return f"{(ts - start_ts) / 1000:+.3f} s"


def size(count: int | None) -> str:
    if count is None:
        return "? B"
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= factor:
            return f"{count / factor:.1f} {unit}"
    return f"{count} B"


def _attempt(e: Any) -> str:
    return attempt_name(e.vertex, e.subtask, e.attempt)


def _hosts(hosts: tuple[str, ...]) -> str:
    return ", ".join(hosts) or "no host"


def _slow(finding: r.SlowTasksDetected) -> str:
    if not finding.slow:
        return f"{finding.vertex}: no slow subtask any more"
    per_byte = f", {finding.baseline_ns_per_byte:.0f} ns/B" if finding.baseline_ns_per_byte else ""
    slow = [
        f"{attempt_name(finding.vertex, s.subtask, a.attempt)} on {a.host} "
        f"for {a.execution_time_ms} ms ({size(a.input_bytes)})"
        for s in finding.slow
        for a in s.live_attempts
        if a.slow
    ]
    return (
        f"{finding.vertex}: {len(finding.slow)} slow subtask(s), baseline "
        f"{finding.baseline_ms} ms{per_byte}; slow: {'; '.join(slow)}"
    )


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _recovered(e: r.JobRecovered, start: int) -> str:
    kept = len(e.kept_results) + len(e.kept_sink_parts)
    again = sum(1 for lost in e.lost_results if lost.produced_again)
    lost = (
        f", lost {_plural(len(e.lost_results), 'result')} ({again} produced again)"
        if e.lost_results
        else ""
    )
    return (
        f"driver recovered: kept {_plural(kept, 'result')}"
        + (f" ({len(e.kept_sink_parts)} sink parts)" if e.kept_sink_parts else "")
        + f", re-ran {_plural(len(e.reset_attempts), 'attempt')}{lost}; "
        f"replaces the run begun by {e.replaced_run}, last heard of at "
        f"{relative(e.last_event_ts, start)} (event {e.last_sequence}); "
        f"{_plural(e.commands_handled, 'command')} handled before; log from {e.log_source}"
    )


def _restart(c: r.RestartTasks, start: int) -> str:
    tasks = ", ".join(attempt_name(t.vertex, t.subtask) for t in c.tasks)
    return f"restart {tasks} not before {relative(c.not_before_ts, start)}: {c.reason}"


def _settings(s: r.PolicySettings) -> str:
    own = ", ".join(f"{k}={s.settings.get(k, '?')}" for k in s.explicit) or "none"
    job = ", ".join(f"{k}={v}" for k, v in sorted(s.job_settings.items())) or "none"
    return f"{s.service} decides with settings version {s.version} (set: {own}; the job's: {job})"


# type -> (record, job start ts) -> text; one entry per record type (a test checks coverage).
_DESCRIBE: dict[type[r.Record], Callable[[Any, int], str]] = {
    r.JobSubmitted: lambda e, _: f"job {e.name!r} submitted, {len(e.graph.vertices)} vertices",
    r.NodeAdded: lambda e, _: f"{e.host} joined with {e.slots} slot(s)",
    r.NodeRemoved: lambda e, _: f"{e.host} left: {e.reason or 'no reason given'}",
    r.NodeBlocked: lambda e, t: f"{e.host} blocked until {relative(e.until_ts, t)}: {e.cause}",
    r.NodeUnblocked: lambda e, _: f"{e.host} unblocked",
    r.VertexInitialized: lambda e, _: (
        f"{e.vertex} initialised with parallelism {e.parallelism}, decided by {e.decided_by}"
    ),
    r.AttemptDeploying: lambda e, _: (
        f"{_attempt(e)} deployed on {e.host}" + (", speculative" if e.speculative else "")
    ),
    r.AttemptFinished: lambda e, _: (
        f"{_attempt(e)} finished on {e.host}: read {size(e.input_bytes)}, {e.records} records, "
        f"wrote {size(sum(e.bytes_per_subpartition))}"
    ),
    r.AttemptFailed: lambda e, _: (
        f"{_attempt(e)} failed on {e.host}: {e.error.value}: {e.message}"
        + (
            f" (missing {attempt_name(p.vertex, p.subtask, p.attempt)})"
            if (p := e.missing_partition)
            else ""
        )
    ),
    r.AttemptCanceled: lambda e, _: f"{_attempt(e)} cancelled on {e.host}: {e.reason.value}",
    r.AttemptProgress: lambda e, _: (
        f"{_attempt(e)} read {size(e.bytes_read)} of {size(e.bytes_total)}, "
        f"{e.records_read} records"
    ),
    r.PartitionReleased: lambda e, _: (
        f"partition of {attempt_name(e.partition.vertex, e.partition.subtask, e.partition.attempt)}"
        " released"
    ),
    r.Tick: lambda e, _: "tick: the agent's clock for time-driven checks",
    r.CommandApplied: lambda e, _: f"{e.command_type} {e.command_id} applied",
    r.CommandRejected: lambda e, _: f"{e.command_type} {e.command_id} rejected: {e.reason}",
    r.JobFinished: lambda e, _: (
        f"job {e.status.value.lower()}" + (f": {e.message}" if e.message else "")
    ),
    r.JobRecovered: _recovered,
    r.SlowTasksDetected: lambda f, _: _slow(f),
    r.SpeculativeAttemptWon: lambda f, _: (
        f"speculative attempt {_attempt(f)} on {f.host} finished first"
    ),
    r.LaunchSpeculativeAttempts: lambda c, _: (
        f"launch {c.count} speculative attempt(s) of {attempt_name(c.vertex, c.subtask)}, "
        f"avoiding {_hosts(c.avoid_hosts)}"
    ),
    r.BlockNodes: lambda c, t: (
        f"block {_hosts(c.hosts)} until {relative(c.until_ts, t)}: {c.cause}"
    ),
    r.UnblockNodes: lambda c, _: f"unblock {_hosts(c.hosts)}",
    r.SetParallelism: lambda c, _: _parallelism(c),
    r.RestartTasks: _restart,
    r.FailJob: lambda c, _: f"fail the job: {c.reason}",
    r.FindingSettings: lambda s, _: _settings(s),
    r.CommandSettings: lambda s, _: _settings(s),
}


def _parallelism(c: r.SetParallelism) -> str:
    text = f"{c.vertex}: parallelism {c.parallelism}{_skew_splits(c.skew_splits)}"
    b = c.broadcast
    if b is None:
        return text
    # Why the join was broadcast (Flink's adaptive broadcast join), as the decider saw it.
    return (
        f"{text}, broadcast join: its {b.side} side {b.input} produced {b.bytes} bytes, under "
        f"table.optimizer.join.broadcast-threshold {b.threshold}, so every subtask reads it "
        f"whole; the other side, unless it had started, is not shuffled (a source runs inside "
        f"the join's subtasks, anything else is written unshuffled)"
    )


def _skew_splits(splits: tuple[r.SkewSplit, ...]) -> str:
    """Why some subtasks read part of a hash-partitioned input (Flink's adaptive skewed join)."""
    if not splits:
        return ""
    each = "; ".join(
        f"{x.input} subpartition {x.subpartition} ({x.bytes} bytes, above the skew threshold "
        f"{x.threshold}) into {x.pieces} pieces of its partitions"
        for x in splits
    )
    return (
        f", skewed join split: {each}, each piece read with the other side's whole matching "
        f"subpartition"
    )


def describe(record: r.Record, start_ts: int) -> str:
    """What `record` says, in one line."""
    text = _DESCRIBE.get(type(record))
    if text is not None:
        return text(record, start_ts)
    # A record type newer than this table: its own fields, so nothing is hidden.
    own = (f for f in fields(record) if f.name not in COMMON_FIELDS)
    return ", ".join(f"{f.name}={getattr(record, f.name)!r}" for f in own)


def headline(record: r.Record, start_ts: int) -> str:
    """`Type id at +t`: how a record is named in lists."""
    return f"{type(record).__name__} {record.id} at {relative(record.ts, start_ts)}"
