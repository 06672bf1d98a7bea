"""Write the Avro contracts in `schemas/` from the record dataclasses (run once per change).

The .avsc files are the source of truth that is committed and released; this script only saves
typing when a record changes. Review its diff like any other contract change, and never rerun it
over `schemas/released/` (released versions are frozen copies).

    .venv/bin/python tools/gen_schemas.py            # rewrite schemas/{events,findings,commands}
    .venv/bin/python tools/gen_schemas.py --check    # exit 1 if the files differ from the output

Every schema is self-contained: a named type (enum or nested record) is defined in full where it
first appears in a schema and referenced by its full name after that, so each record type has a
canonical form, and hence a fingerprint, of its own.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any

from tailguard.model import records as r

NAMESPACE = "io.tailguard"
ROOT = Path(__file__).resolve().parent.parent / "schemas"
TOPIC_DIRS = {r.EVENTS_TOPIC: "events", r.FINDINGS_TOPIC: "findings", r.COMMANDS_TOPIC: "commands"}

# Docs of the named types. A record's own docstring is used when it has one.
TYPE_DOCS: dict[str, str] = {
    "VertexKind": "Role of a vertex in the job graph.",
    "Distribution": "How a producer's records reach the consumer's subtasks (Flink's patterns).",
    "Exchange": "Result partition type of an edge (FLIP-119 / FLIP-1).",
    "ErrorKind": "Why an attempt failed; decides what the failover service restarts.",
    "CancelReason": "Why an attempt was canceled.",
    "JobStatus": "Final status of a job.",
    "VertexSpec": "One vertex of the user's job graph as submitted.",
    "EdgeSpec": "A job edge; `index` orders a vertex's inputs (the first input of a join is 0).",
    "JobGraphSpec": "The user's job graph as submitted: vertices and edges.",
    "InputRange": "What one consumer subtask reads of one input (ExecutionVertexInputInfo).",
    "SubtaskInputs": "The input ranges one subtask of a vertex reads.",
    "SkewSplit": "A skewed subpartition of one input, split along its producer's partitions.",
    "BroadcastJoin": "Why a join reads one side broadcast (adaptive broadcast join).",
    "PartitionRef": "A result partition: the output of one attempt of one producer subtask.",
    "TaskRef": "One subtask of a vertex.",
    "AttemptRef": "One attempt of one subtask.",
    "ResultLoss": "Why a finished result did not survive its driver (found on recovery).",
    "SlowAttempt": "A live attempt of a slow subtask at detection time.",
    "SlowSubtask": "A subtask found slow, with its live attempts.",
    "JobSubmitted": "A job was submitted: its graph and its configuration.",
    "NodeAdded": "A node (worker host) joined the job's cluster.",
    "NodeRemoved": "A node left the job's cluster.",
    "NodeBlocked": "The agent stopped placing new attempts on a host (MARK_BLOCKED).",
    "NodeUnblocked": "The agent lifted the block of a host.",
    "VertexInitialized": "A vertex's parallelism and subtask input ranges were fixed.",
    "AttemptDeploying": "An attempt of a subtask is being deployed on a host.",
    "AttemptFinished": "An attempt finished successfully and its output partition is available.",
    "AttemptFailed": "An attempt failed.",
    "AttemptCanceled": "An attempt was canceled.",
    "PartitionReleased": "A result partition was released and can no longer be read.",
    "Tick": "The agent's periodic clock event: time-driven checks happen at its ts.",
    "CommandApplied": "The agent applied a command.",
    "CommandRejected": "The agent rejected a command.",
    "JobFinished": "The job ended.",
    "JobRecovered": (
        "A new driver took the job over after its driver died; the first event it publishes "
        "(Flink 1.20's JobEventStore / DefaultBatchJobRecoveryHandler record no single event "
        "for this). The reset attempts are ended by AttemptCanceled (RESTART) right after it."
    ),
    "LaunchSpeculativeAttempts": "Launch speculative attempts of a slow subtask (FLIP-168).",
    "BlockNodes": "Block hosts for new attempts until a time (slow-node blocking).",
    "UnblockNodes": "Lift the block of hosts.",
    "SetParallelism": "The decider's parallelism and input ranges for a vertex (FLIP-187).",
    "RestartTasks": "Restart subtasks after a failure (FLIP-1 regions).",
    "FailJob": "End the job as failed (restart limits reached or unrecoverable error).",
    "FindingSettings": (
        "The detector's policy settings for a job: the speculator and the blocklist read the "
        "job's own settings from it. Sent before the detector's first finding for the job, "
        "which it decides under (schema v7)."
    ),
    "CommandSettings": (
        "The policy settings a service sends commands for a job with: sent before its first "
        "command for the job, which it decides under (schema v7)."
    ),
}

# Field docs by field name; "Type.field" overrides for names whose meaning depends on the type.
FIELD_DOCS: dict[str, str] = {
    "job_id": "Id of the job; the Kafka key, so a job's records stay in order.",
    "ts": "Event time in milliseconds since the epoch; the 'now' of whoever processes it.",
    "id": "Unique id of this record (commands and findings: derived, deterministic).",
    "caused_by": "Ids of the records that led to this one.",
    "name": "Name of the vertex (unique within the job).",
    "JobSubmitted.name": "Human-readable name of the job.",
    "graph": "The job graph.",
    "config": "Job settings with Flink-style keys and string values, as written in the TOML.",
    "kind": "Role of the vertex.",
    "parallelism": "Number of subtasks.",
    "VertexSpec.parallelism": "Fixed parallelism chosen by the user; null lets the decider choose.",
    "max_parallelism": "Upper bound of the parallelism; null: the job's default applies.",
    "min_parallelism": (
        "Lower bound of the parallelism the decider chooses; null: the job's min-parallelism "
        "applies."
    ),
    "join": (
        "The relational join the vertex runs (inner, left, right, full, semi, anti; input 0 is "
        "the left side); null for any other vertex."
    ),
    "skew_splits": "The skewed subpartitions split across subtasks; empty when none was.",
    "SkewSplit.input": "Name of the producing vertex whose subpartition was split.",
    "SkewSplit.subpartition": "Index of the skewed subpartition.",
    "SkewSplit.bytes": "Bytes of that subpartition, summed over the producer's partitions.",
    "SkewSplit.threshold": "The skew threshold those bytes exceeded.",
    "SkewSplit.pieces": "Into how many partition ranges the subpartition was cut.",
    "broadcast": (
        "Set when the decider turned the join into a broadcast join: the side read broadcast "
        "and why; null otherwise."
    ),
    "BroadcastJoin.input": "Name of the producing vertex read broadcast by every subtask.",
    "BroadcastJoin.side": "Which side of the join it is: left (input 0) or right (input 1).",
    "BroadcastJoin.bytes": "Bytes that side produced, summed over its partitions.",
    "BroadcastJoin.threshold": "The table.optimizer.join.broadcast-threshold they were under.",
    "speculation_safe": "Whether concurrent attempts of one subtask are allowed.",
    "split_bytes": "Sources only: size in bytes of each split, in deterministic split order.",
    "operators": (
        "The user's operators this vertex runs as one chain, head first (operator chaining); "
        "empty when the vertex is a single operator recorded before chaining."
    ),
    "vertices": "The vertices of the graph.",
    "edges": "The edges of the graph.",
    "source": "Name of the producing vertex.",
    "target": "Name of the consuming vertex.",
    "distribution": "Distribution pattern of the edge.",
    "exchange": "Result partition type of the edge.",
    "index": "Position of this edge among the target's inputs.",
    "input": "Name of the producing vertex read, or '@splits' for a source's splits.",
    "partition_start": "First producer subtask (or split index) read, inclusive.",
    "partition_end": "Last producer subtask (or split index) read, inclusive.",
    "subpartition_start": "First subpartition read of each producer subtask, inclusive.",
    "subpartition_end": "Last subpartition read of each producer subtask, inclusive.",
    "inputs": "What the subtask reads, one range per input.",
    "vertex": "Name of the vertex.",
    "subtask": "Index of the subtask within its vertex (0-based).",
    "attempt": "Attempt number of the subtask (0-based, increasing).",
    "host": "Host (worker address) of the attempt.",
    "NodeAdded.host": "Host (worker address) that joined.",
    "NodeRemoved.host": "Host (worker address) that left.",
    "NodeBlocked.host": "Host that is blocked.",
    "NodeUnblocked.host": "Host that is no longer blocked.",
    "slots": "Number of task slots the host offers.",
    "reason": "Why, in words.",
    "RestartTasks.reason": "Why the tasks restart, in words (the failure that caused it).",
    "AttemptCanceled.reason": "Why the attempt was canceled.",
    "until_ts": "Time (ms) until which the hosts stay blocked.",
    "cause": "What the block is for, in words (e.g. the finding that caused it).",
    "command_id": "Id of the command this event carries out; null when the agent acted alone.",
    "CommandApplied.command_id": "Id of the applied command.",
    "CommandRejected.command_id": "Id of the rejected command.",
    "subtask_inputs": "Per subtask, the ranges of its inputs it reads.",
    "decided_by": "Who chose the parallelism: decider, fixed, forward-group, agent-fallback, ...",
    "speculative": "Whether this is a speculative attempt.",
    "input_bytes": "Bytes the attempt read; null when unknown.",
    "records": "Number of records the attempt wrote.",
    "bytes_per_subpartition": "Bytes written to each subpartition, by subpartition index.",
    "checksums": "Checksum of each subpartition written, by subpartition index.",
    "error": "Kind of the error.",
    "message": "Error or status message, in words.",
    "missing_partition": "The consumed partition found missing or corrupt, if any.",
    "non_recoverable": (
        "The error recurs wherever the attempt runs, such as an import error (Flink's "
        "ThrowableType.NonRecoverableError): the job fails without a restart. False in records "
        "written before schema v3."
    ),
    "partition": "The released partition.",
    "command_type": "Record name of the command (e.g. BlockNodes).",
    "status": "Final status of the job.",
    "baseline_ms": "Baseline execution time in ms (median of the fastest finished x multiplier).",
    "baseline_ns_per_byte": "Baseline time per input byte in ns; null when input sizes unknown.",
    "slow": "The slow subtasks; empty: the vertex has no slow subtask any more.",
    "SlowAttempt.slow": "Whether this live attempt met the slow rule itself (blockable host).",
    "hosts": "Hosts concerned.",
    "SlowTasksDetected.hosts": "Hosts registered with the job at detection time.",
    "slow_hosts": "Hosts found slow at this check by the slow-host rule (block at once).",
    "avoid_hosts": "Hosts on which the new attempts must not run.",
    "count": "How many speculative attempts to launch.",
    "tasks": "The subtasks to restart.",
    "not_before_ts": "Time (ms) before which the restart must not happen (restart backoff).",
    "live_attempts": "The live (deploying or running) attempts at detection time.",
    "latest_attempt": "The highest attempt number the subtask has had.",
    "execution_time_ms": "Execution time of the attempt so far, in ms.",
    "records_read": "Records the attempt has read so far.",
    "bytes_read": "Input bytes the attempt has read so far.",
    "replaced_run": (
        "Id of the event that began the driver run this one replaces: the job's JobSubmitted, "
        "or the JobRecovered of an earlier recovery."
    ),
    "last_sequence": "The last event sequence number the dead driver reached.",
    "last_event_ts": "Event time (ms) of the dead driver's last event: when it was last heard of.",
    "log_source": "Where the dead driver's log was read from, in words.",
    "reset_attempts": "Attempts running when the driver died: reset, their subtasks run again.",
    "kept_results": "Finished result partitions whose files still verify: kept, not re-run.",
    "kept_sink_parts": "Sink subtasks whose committed part still verifies: kept, not re-run.",
    "lost_results": (
        "Finished results (partitions, or committed sink parts) whose files no longer verify."
    ),
    "LostResult.partition": (
        "The lost result partition; for a sink part, the attempt that committed it."
    ),
    "loss": "Why the result is lost: a file missing, or bytes not matching its checksum.",
    "produced_again": "Whether its producer runs again (an unfinished consumer still reads it).",
    "commands_handled": "How many command ids the dead driver had applied or rejected.",
    "service": "The service that decides with these settings.",
    "version": "Digest of `settings` and `explicit`: the settings version outputs name.",
    "settings": "Every policy key with the service's value (never a secret).",
    "explicit": "Keys the service's configuration sets: they win over a job's config.",
    "job_settings": "The job's own policy settings (its JobSubmitted.config), as received.",
    "bytes_total": (
        "Input bytes assigned to the attempt (its splits or subpartition ranges), when known."
    ),
}


def _field_doc(owner: str, name: str) -> str:
    doc = FIELD_DOCS.get(f"{owner}.{name}") or FIELD_DOCS.get(name)
    if doc is None:
        raise SystemExit(f"no doc for field {owner}.{name}: add one to FIELD_DOCS")
    return doc


def _type_doc(cls: type) -> str:
    doc = TYPE_DOCS.get(cls.__name__)
    own = cls.__doc__ or ""
    # dataclass() fills a missing docstring with the signature, which is no doc.
    if doc is None and own and not own.startswith(f"{cls.__name__}("):
        doc = " ".join(own.split())
    if doc is None:
        raise SystemExit(f"no doc for type {cls.__name__}: add one to TYPE_DOCS")
    return doc


class _SchemaWriter:
    """Builds one self-contained schema; remembers which named types it has defined."""

    def __init__(self) -> None:
        self.defined: set[str] = set()

    def named(self, cls: type) -> Any:
        full = f"{NAMESPACE}.{cls.__name__}"
        if full in self.defined:
            return full
        self.defined.add(full)
        if issubclass(cls, enum.Enum):
            return {
                "type": "enum",
                "name": cls.__name__,
                "namespace": NAMESPACE,
                "doc": _type_doc(cls),
                "symbols": [member.name for member in cls],
            }
        hints = typing.get_type_hints(cls)
        fields = []
        for f in dataclasses.fields(cls):
            hint = hints[f.name]
            entry: dict[str, Any] = {"name": f.name, "doc": _field_doc(cls.__name__, f.name)}
            entry["type"] = self.type_of(hint)
            default = _avro_default(f, hint)
            if default is not dataclasses.MISSING:
                entry["default"] = default
            fields.append(entry)
        return {
            "type": "record",
            "name": cls.__name__,
            "namespace": NAMESPACE,
            "doc": _type_doc(cls),
            "fields": fields,
        }

    def type_of(self, hint: Any) -> Any:
        if hint is str:
            return "string"
        if hint is bool:
            return "boolean"
        if hint is int:
            return "long"
        if hint is float:
            return "double"
        origin = typing.get_origin(hint)
        args = typing.get_args(hint)
        if origin is types.UnionType or origin is typing.Union:
            (inner,) = [a for a in args if a is not type(None)]
            return ["null", self.type_of(inner)]
        if origin is tuple:
            return {"type": "array", "items": self.type_of(args[0])}
        if origin is dict:
            return {"type": "map", "values": self.type_of(args[1])}
        if isinstance(hint, type) and (
            issubclass(hint, enum.Enum) or dataclasses.is_dataclass(hint)
        ):
            return self.named(hint)
        raise SystemExit(f"no Avro type for {hint!r}")


def _avro_default(f: dataclasses.Field[Any], hint: Any) -> Any:
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        # Optional fields default to null even where the dataclass requires them, so a field
        # added as optional later can be read from old data.
        return None
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return dataclasses.MISSING
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, tuple):
        return list(value)
    return value


def schema_for(cls: type[r.Record]) -> dict[str, Any]:
    return dict(_SchemaWriter().named(cls))


def render(cls: type[r.Record]) -> str:
    return json.dumps(schema_for(cls), indent=2) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    stale = []
    for cls in r.RECORD_TYPES:
        path = ROOT / TOPIC_DIRS[cls.TOPIC] / f"{cls.__name__}.avsc"
        text = render(cls)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for path in stale:
        print(f"differs from the dataclass: {path}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
