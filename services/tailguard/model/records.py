"""The records of the three topics, as immutable dataclasses.

`schemas/` is the contract; these classes mirror it field for field (a unit test checks that).
Every record carries `job_id`, an event-time `ts` in milliseconds and an `id`. Findings and
commands also carry `caused_by`: the ids of the records that led to them, which is what lets a
replay line a decision up with its causes.

The module is pure: standard library only.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import ClassVar

EVENTS_TOPIC = "tailguard.events"
FINDINGS_TOPIC = "tailguard.findings"
COMMANDS_TOPIC = "tailguard.commands"
TOPICS = (EVENTS_TOPIC, FINDINGS_TOPIC, COMMANDS_TOPIC)

# The input name under which a source's subtask is assigned a range of its splits, in the same
# InputRange shape that consumers use for the partitions of their producers.
SPLITS_INPUT = "@splits"


# --------------------------------------------------------------------------- enums


class VertexKind(enum.Enum):
    SOURCE = "SOURCE"
    OPERATOR = "OPERATOR"
    SINK = "SINK"


class Distribution(enum.Enum):
    """How a producer's records reach the consumer's subtasks (Flink's distribution patterns)."""

    FORWARD = "FORWARD"
    POINTWISE = "POINTWISE"
    ALL_TO_ALL = "ALL_TO_ALL"
    BROADCAST = "BROADCAST"


class Exchange(enum.Enum):
    """Result partition type of an edge (FLIP-119 / FLIP-1)."""

    BLOCKING = "BLOCKING"
    PIPELINED = "PIPELINED"


class ErrorKind(enum.Enum):
    USER = "USER"
    PARTITION_MISSING = "PARTITION_MISSING"
    PARTITION_CORRUPT = "PARTITION_CORRUPT"
    NODE_LOST = "NODE_LOST"
    INFRA = "INFRA"


class CancelReason(enum.Enum):
    LOST_RACE = "LOST_RACE"
    RESTART = "RESTART"
    JOB_CANCELED = "JOB_CANCELED"


class JobStatus(enum.Enum):
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELED = "CANCELED"


class ResultLoss(enum.Enum):
    """Why a result a dead driver had finished did not survive it (found on recovery)."""

    MISSING = "MISSING"  # a file of it is gone or cannot be read
    CHECKSUM_MISMATCH = "CHECKSUM_MISMATCH"  # its bytes are not those its AttemptFinished hashed


# --------------------------------------------------------------------------- nested values


@dataclass(frozen=True, slots=True)
class VertexSpec:
    """One vertex of the user's job graph as submitted."""

    name: str
    kind: VertexKind
    # None: the decider chooses (adaptive); a number: fixed by the user.
    parallelism: int | None = None
    # None: the job's default max-parallelism applies.
    max_parallelism: int | None = None
    speculation_safe: bool = True
    # Sources only: the size in bytes of each split, in the deterministic split order.
    split_bytes: tuple[int, ...] = ()
    # The user's operators this vertex runs as one chain, head first (Flink's operator
    # chaining); empty in records written before chaining, where the vertex is one operator.
    operators: tuple[str, ...] = ()
    # None: the job's min-parallelism applies (Flink 2.1's per-vertex `vertexMinParallelism`).
    min_parallelism: int | None = None
    # The relational join this vertex runs (`how`: inner, left, right, full, semi, anti; input
    # 0 is the left side), None for any other vertex: which side's skewed subpartitions the
    # decider may split follows from it (Flink's adaptive skewed join).
    join: str | None = None


@dataclass(frozen=True, slots=True)
class EdgeSpec:
    """A job edge; `index` orders a vertex's inputs (the first input of a join is 0)."""

    source: str
    target: str
    distribution: Distribution
    exchange: Exchange = Exchange.BLOCKING
    index: int = 0


@dataclass(frozen=True, slots=True)
class JobGraphSpec:
    vertices: tuple[VertexSpec, ...]
    edges: tuple[EdgeSpec, ...]


@dataclass(frozen=True, slots=True)
class InputRange:
    """What one consumer subtask reads of one input (Flink's ExecutionVertexInputInfo).

    Producer subtasks `partition_start..partition_end` and, of each, subpartitions
    `subpartition_start..subpartition_end`, all bounds inclusive. For a source the input is
    `SPLITS_INPUT` and the partition range is a range of split indices.
    """

    input: str
    partition_start: int
    partition_end: int
    subpartition_start: int
    subpartition_end: int


@dataclass(frozen=True, slots=True)
class SubtaskInputs:
    subtask: int
    inputs: tuple[InputRange, ...]


@dataclass(frozen=True, slots=True)
class PartitionRef:
    """A result partition: the output of one attempt of one producer subtask."""

    vertex: str
    subtask: int
    attempt: int


@dataclass(frozen=True, slots=True)
class TaskRef:
    vertex: str
    subtask: int


@dataclass(frozen=True, slots=True)
class AttemptRef:
    """One attempt of one subtask."""

    vertex: str
    subtask: int
    attempt: int


@dataclass(frozen=True, slots=True)
class LostResult:
    """A finished result (a result partition, or a sink's committed part: then `partition` names
    the attempt that committed it) whose files no longer verify."""

    partition: PartitionRef
    loss: ResultLoss
    # Whether its producer runs again: only when an unfinished consumer still reads it (a
    # sink's part, the job's output, always).
    produced_again: bool


@dataclass(frozen=True, slots=True)
class SlowAttempt:
    attempt: int
    host: str
    execution_time_ms: int
    # Its input's size; when that is unknown (a Spark task: Spark says what a running task has
    # read, never what it will read), the bytes it had read by its last report (its size is at
    # least that); None when neither is known.
    input_bytes: int | None = None
    speculative: bool = False
    # Whether this live attempt met the slow rule itself. A slow subtask lists all its live
    # attempts (the speculator must count them), but only the slow ones' hosts may be blocked.
    slow: bool = True


@dataclass(frozen=True, slots=True)
class SlowSubtask:
    subtask: int
    # The live attempts (deploying or running) at detection time; the slow ones among them.
    live_attempts: tuple[SlowAttempt, ...]
    # The highest attempt number the subtask has had; lets the speculator tell a new situation
    # (an attempt failed or was added since) from a repeat of one it already answered.
    latest_attempt: int


# --------------------------------------------------------------------------- base


@dataclass(frozen=True, slots=True, kw_only=True)
class Record:
    """Fields every record has."""

    TOPIC: ClassVar[str] = ""
    job_id: str
    ts: int
    id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Event(Record):
    TOPIC: ClassVar[str] = EVENTS_TOPIC


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding(Record):
    TOPIC: ClassVar[str] = FINDINGS_TOPIC
    caused_by: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Command(Record):
    TOPIC: ClassVar[str] = COMMANDS_TOPIC
    caused_by: tuple[str, ...] = ()


# --------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSubmitted(Event):
    name: str
    graph: JobGraphSpec
    # Flink-style keys with string values, as in the job's TOML config.
    config: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeAdded(Event):
    host: str
    slots: int


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeRemoved(Event):
    host: str
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeBlocked(Event):
    host: str
    until_ts: int
    cause: str = ""
    command_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeUnblocked(Event):
    host: str
    command_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class VertexInitialized(Event):
    vertex: str
    parallelism: int
    subtask_inputs: tuple[SubtaskInputs, ...]
    # "decider", "fixed", "forward-group", "agent-fallback", ...: who chose the parallelism.
    decided_by: str
    command_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptDeploying(Event):
    vertex: str
    subtask: int
    attempt: int
    host: str
    speculative: bool = False
    command_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptFinished(Event):
    vertex: str
    subtask: int
    attempt: int
    host: str
    input_bytes: int | None
    records: int
    bytes_per_subpartition: tuple[int, ...]
    checksums: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptFailed(Event):
    vertex: str
    subtask: int
    attempt: int
    host: str
    error: ErrorKind
    message: str
    missing_partition: PartitionRef | None = None
    # The error recurs wherever the attempt runs (Flink's ThrowableType.NonRecoverableError):
    # the failover fails the job without consulting the restart strategy.
    non_recoverable: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptCanceled(Event):
    vertex: str
    subtask: int
    attempt: int
    host: str
    reason: CancelReason


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptProgress(Event):
    """How far a running attempt has read its input, reported by its slot runner."""

    vertex: str
    subtask: int
    attempt: int
    host: str
    records_read: int
    bytes_read: int
    # The bytes assigned to the attempt (its splits or subpartition ranges), when known.
    bytes_total: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PartitionReleased(Event):
    partition: PartitionRef


@dataclass(frozen=True, slots=True, kw_only=True)
class Tick(Event):
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class CommandApplied(Event):
    command_id: str
    command_type: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CommandRejected(Event):
    command_id: str
    command_type: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class JobFinished(Event):
    status: JobStatus
    message: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobRecovered(Event):
    """A new driver took the job over after its driver died: the first event it publishes.

    Flink 1.20 (FLIP-383) has no single event for this: its `JobEventStore` holds the
    execution-vertex and job-vertex events a recovery replays, and
    `DefaultBatchJobRecoveryHandler` reconciles and resets without recording the takeover. The
    attempts it lists as reset are ended for the services by `AttemptCanceled` (RESTART) events
    right after it; the lost results still read by someone are `PartitionReleased` after those.
    """

    # Id of the event that began the driver run replaced: the job's JobSubmitted, or the
    # JobRecovered of an earlier recovery. The log knows runs by their events, not by process.
    replaced_run: str
    # The last event sequence number the dead driver reached (this event's is the next one),
    # and that event's ts: when the dead driver was last heard of.
    last_sequence: int
    last_event_ts: int
    # Where the dead driver's log was read from, in words (the archive, the events topic).
    log_source: str
    reset_attempts: tuple[AttemptRef, ...]
    kept_results: tuple[PartitionRef, ...]
    kept_sink_parts: tuple[TaskRef, ...]
    lost_results: tuple[LostResult, ...]
    # Command ids the dead driver had applied or rejected: none of them is applied again.
    commands_handled: int


# --------------------------------------------------------------------------- findings


@dataclass(frozen=True, slots=True, kw_only=True)
class SlowTasksDetected(Finding):
    """Slow subtasks of one vertex at one check. An empty `slow` list says the vertex has no
    slow subtask any more (sent once, after a check that found some), so readers of findings
    alone can keep FLIP-168's numSlowExecutionVertices current."""

    vertex: str
    speculation_safe: bool
    # Baseline execution time (ms) and, when input sizes are known, per input byte (ns/byte).
    baseline_ms: int
    baseline_ns_per_byte: float | None
    slow: tuple[SlowSubtask, ...]
    # Hosts registered with the job at detection time: what the blocklist needs to keep its
    # max-blocked-fraction without reading another topic.
    hosts: tuple[str, ...]
    # Hosts the slow-host rule found slow at this check (their attempts run several times
    # slower per input byte than their peers'): the blocklist blocks them without waiting for
    # more slow subtasks. Empty from older detectors and with the rule off.
    slow_hosts: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeculativeAttemptWon(Finding):
    """A speculative attempt finished before every other attempt of its subtask (FLIP-168's
    numEffectiveSpeculativeExecutions counts these)."""

    vertex: str
    subtask: int
    attempt: int
    host: str


# --------------------------------------------------------------------------- policy settings


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicySettings(Record):
    """The policy settings a service decides a job with: a fact in the log that the service's
    outputs for the job point at (`model.policy_settings`). Sent before the service's first
    output for the job, on the topic its outputs travel on, so a job's archive holds it."""

    caused_by: tuple[str, ...] = ()
    # Which service, and the version (a digest) of `settings` with `explicit`.
    service: str
    version: str
    # Every policy key (the keys of `config.DEFAULTS`, never a secret) with the service's value.
    settings: dict[str, str]
    # The keys the service's own configuration sets: they win over a job's config; the others
    # follow the job's config (`Settings.for_job`).
    explicit: tuple[str, ...] = ()
    # The job's own policy settings (its JobSubmitted.config), as the service learnt them.
    job_settings: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class FindingSettings(PolicySettings):
    """The detector's policy settings for a job, on the findings topic: the speculator and the
    blocklist read the job's own settings from it (they read no events)."""

    TOPIC: ClassVar[str] = FINDINGS_TOPIC


@dataclass(frozen=True, slots=True, kw_only=True)
class CommandSettings(PolicySettings):
    """The policy settings of a service that sends commands, on the commands topic."""

    TOPIC: ClassVar[str] = COMMANDS_TOPIC


# --------------------------------------------------------------------------- commands


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchSpeculativeAttempts(Command):
    vertex: str
    subtask: int
    count: int
    avoid_hosts: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class BlockNodes(Command):
    hosts: tuple[str, ...]
    until_ts: int
    cause: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class UnblockNodes(Command):
    hosts: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SkewSplit:
    """One skewed subpartition of one input that the decider split along its producer's
    partitions (Flink's adaptive skewed join): its bytes, the threshold they exceeded, and
    into how many pieces, each read by its own subtask(s) with the other side's whole
    matching subpartition."""

    input: str
    subpartition: int
    bytes: int
    threshold: int
    pieces: int


@dataclass(frozen=True, slots=True)
class BroadcastJoin:
    """Why a join reads one side broadcast (Flink's `AdaptiveBroadcastJoinOptimizationStrategy`):
    that side's producer, which side of the join it is, the bytes it produced and the
    `table.optimizer.join.broadcast-threshold` they were under."""

    input: str
    side: str
    bytes: int
    threshold: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SetParallelism(Command):
    vertex: str
    parallelism: int
    subtask_inputs: tuple[SubtaskInputs, ...]
    # The skewed subpartitions split across subtasks (why some subtasks read a partition range
    # of a hash-partitioned input); empty when none was.
    skew_splits: tuple[SkewSplit, ...] = ()
    # Set when the decider turned a join into a broadcast join (Flink's adaptive broadcast
    # join): the side read broadcast by every subtask and why; the other side is then read as
    # it was produced, one partition range per subtask, with no shuffle.
    broadcast: BroadcastJoin | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RestartTasks(Command):
    tasks: tuple[TaskRef, ...]
    reason: str
    not_before_ts: int


@dataclass(frozen=True, slots=True, kw_only=True)
class FailJob(Command):
    reason: str


EVENT_TYPES: tuple[type[Event], ...] = (
    JobSubmitted,
    NodeAdded,
    NodeRemoved,
    NodeBlocked,
    NodeUnblocked,
    VertexInitialized,
    AttemptDeploying,
    AttemptFinished,
    AttemptFailed,
    AttemptCanceled,
    AttemptProgress,
    PartitionReleased,
    Tick,
    CommandApplied,
    CommandRejected,
    JobFinished,
    JobRecovered,
)
FINDING_TYPES: tuple[type[Finding], ...] = (SlowTasksDetected, SpeculativeAttemptWon)
COMMAND_TYPES: tuple[type[Command], ...] = (
    LaunchSpeculativeAttempts,
    BlockNodes,
    UnblockNodes,
    SetParallelism,
    RestartTasks,
    FailJob,
)
# Not findings or commands (no service acts on them, the agent applies none of them).
SETTINGS_TYPES: tuple[type[PolicySettings], ...] = (FindingSettings, CommandSettings)
RECORD_TYPES: tuple[type[Record], ...] = (
    EVENT_TYPES + FINDING_TYPES + COMMAND_TYPES + SETTINGS_TYPES
)
RECORD_TYPES_BY_NAME: dict[str, type[Record]] = {t.__name__: t for t in RECORD_TYPES}
