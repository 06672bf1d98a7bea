"""Job recovery after a driver crash: the new driver's state, rebuilt from the dead one's log.

Flink 1.20 recovers a batch job after a JobManager failover (FLIP-383) in three steps, which this
module follows:

1. `JobEventStore` keeps the job's events; on recovery `DefaultBatchJobRecoveryHandler` replays
   them (`startRecovering` -> `restoreVertex...`) to rebuild which vertices were initialised with
   which parallelism and which executions finished. Here the event store is the job's log (its
   archive, completed from the events topic: `JobLog`) and `rebuild` is the replay: a fold of the
   events into a fresh `ExecutionState`, with the commands that were applied.
2. The handler then reconciles the finished results with the shuffle master (a result partition
   that no longer exists makes its producer unfinished again). Here `reconcile` hashes every kept
   result partition and committed sink part against the checksums its `AttemptFinished`
   reported; one that no longer verifies is lost, and its producer runs again only if some
   consumer still needs it.
3. Executions that were running when the JobManager died are reset and scheduled again. Here the
   attempts that were deploying at the crash are the lost ones: the new driver records each as
   `AttemptCanceled` (reason RESTART, so the services stop timing it) and redeploys its subtask.

Flink records no event for the takeover itself; here the new driver's first event is
`JobRecovered` (`Recovered.marker`): the run it replaces, where that run stopped, and what the
steps above kept, reset and found lost, so the audit trail says where a new driver took over.

Pure bookkeeping over records plus a storage check; no Kafka, Spark or clock. Reading the log is
the shell's job (`agent/adapters/job_log.py`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tailguard.agent.driver.state import Attempt, AttemptStatus, ExecutionState, Subtask
from tailguard.agent.executor import partitions
from tailguard.agent.executor.attempt import AttemptOutcome
from tailguard.agent.executor.sinks import part_name
from tailguard.agent.executor.storage import Storage
from tailguard.model import records as r
from tailguard.model.authority import is_authority_rejection

# A command kind whose logged instance recovery needs (`_logged`).
_C = TypeVar("_C", bound=r.Command)

# Bytes hashed at a time when a kept result is checked.
_HASH_CHUNK_BYTES = 8 << 20


class RecoveryError(Exception):
    """The job cannot be recovered; the message says why and what to do instead."""


@dataclass(frozen=True)
class JobLog:
    """What the dead driver left: its events in publication order, and every command the log
    holds for the job (received from the services, or decided locally), by id."""

    job_id: str
    events: tuple[r.Event, ...]
    commands: Mapping[str, r.Command]
    # Where the events came from, in words (for the log line and the docs' figures).
    source: str


@dataclass
class Recovered:
    """The rebuilt job: what the new driver takes over before it schedules anything."""

    submitted: r.JobSubmitted
    events: tuple[r.Event, ...]
    last_sequence: int
    # Command ids the dead driver handled (applied, or rejected for what they asked): each id
    # is handled once, so none of them is requested or applied again.
    handled: set[str]
    # host -> blocked until (ms), for blocks still in force at the crash.
    blocks: dict[str, int]
    # The event that began the dead driver's run: the JobSubmitted, or the JobRecovered of an
    # earlier recovery (a run is known to the log by its events, not by its process).
    replaced_run: str = ""
    # Attempts that were running when the driver died (their results are gone with it).
    lost_attempts: list[Attempt] = field(default_factory=list)
    # Finished results whose files still verify: result partitions, and sinks' committed parts.
    kept_partitions: list[r.PartitionRef] = field(default_factory=list)
    kept_sink_parts: list[r.TaskRef] = field(default_factory=list)
    # Finished results whose files no longer verify, why, and whether they are produced again.
    lost_results: list[r.LostResult] = field(default_factory=list)

    @property
    def kept_results(self) -> int:
        return len(self.kept_partitions) + len(self.kept_sink_parts)

    @property
    def rerun_partitions(self) -> list[r.PartitionRef]:
        return [lost.partition for lost in self.lost_results if lost.produced_again]

    def marker(self, log_source: str) -> dict[str, Any]:
        """The fields of the `JobRecovered` the new driver publishes before anything else."""
        return {
            "replaced_run": self.replaced_run,
            "last_sequence": self.last_sequence,
            "last_event_ts": self.events[-1].ts,
            "log_source": log_source,
            "reset_attempts": tuple(
                r.AttemptRef(a.vertex, a.subtask, a.number) for a in self.lost_attempts
            ),
            "kept_results": tuple(self.kept_partitions),
            "kept_sink_parts": tuple(self.kept_sink_parts),
            "lost_results": tuple(self.lost_results),
            "commands_handled": len(self.handled),
        }


def sequence_of(job_id: str, event: r.Event) -> int:
    """The sequence number in an event id (`model.ids.event_id`)."""
    prefix = f"{job_id}-e"
    if not event.id.startswith(prefix) or not event.id[len(prefix) :].isdigit():
        raise RecoveryError(f"event {event.id} does not carry a sequence number of job {job_id}")
    return int(event.id[len(prefix) :])


def check_recoverable(log: JobLog) -> r.JobSubmitted:
    """The job's `JobSubmitted`, after checking that there is a job to recover at all."""
    if not log.events or not isinstance(log.events[0], r.JobSubmitted):
        raise RecoveryError(
            f"job {log.job_id}: its log ({log.source}) holds no JobSubmitted: there is nothing "
            "to recover; run the job afresh"
        )
    for event in log.events:
        if isinstance(event, r.JobFinished):
            raise RecoveryError(
                f"job {log.job_id} already ended ({event.status.value}"
                + (f": {event.message}" if event.message else "")
                + "): there is nothing to recover; run the job afresh under a new id"
            )
    return log.events[0]


def rebuild(state: ExecutionState, log: JobLog) -> Recovered:
    """Replay the log's events into `state` (fresh, of the same job graph)."""
    submitted = check_recoverable(log)
    rebuilt = Recovered(
        submitted=submitted,
        events=log.events,
        last_sequence=max(sequence_of(log.job_id, e) for e in log.events),
        handled=set(),
        blocks={},
        replaced_run=_run_start(log.events),
    )
    for event in log.events[1:]:
        _fold(state, rebuilt, log, event)
    for vertex in state.vertices.values():
        for subtask in vertex.subtasks:
            lost = 0
            for attempt in subtask.attempts:
                if attempt.status is not AttemptStatus.DEPLOYING:
                    continue
                # Running at the crash; one already being cancelled was recorded as such. It
                # ended, as far as anyone can tell, when the dead driver was last heard of.
                attempt.status = AttemptStatus.CANCELED
                attempt.finished_at = log.events[-1].ts
                if attempt.cancel_reason is None:
                    attempt.cancel_reason = r.CancelReason.RESTART.value
                    rebuilt.lost_attempts.append(attempt)
                    lost += 1
            if lost:
                _reset(subtask)
    return rebuilt


def _run_start(events: Iterable[r.Event]) -> str:
    """Id of the event that began the log's latest driver run: its JobSubmitted, or the
    JobRecovered of the last recovery."""
    starts = [e.id for e in events if isinstance(e, r.JobSubmitted | r.JobRecovered)]
    return starts[-1]


def _fold(state: ExecutionState, rebuilt: Recovered, log: JobLog, event: r.Event) -> None:
    if isinstance(event, r.VertexInitialized):
        state.initialize(event.vertex, event.parallelism, event.subtask_inputs, event.decided_by)
    elif isinstance(event, r.AttemptDeploying):
        subtask = _subtask(state, event, event.vertex, event.subtask)
        if event.attempt != subtask.next_number():
            raise RecoveryError(
                f"job {log.job_id}: {event.id} deploys attempt {event.attempt} of "
                f"{event.vertex}#{event.subtask}, expected {subtask.next_number()}: the log "
                "is not the driver's own order"
            )
        subtask.wanted = False
        subtask.attempts.append(
            Attempt(
                vertex=event.vertex,
                subtask=event.subtask,
                number=event.attempt,
                host=event.host,
                speculative=event.speculative,
                command_id=event.command_id,
                deployed_at=event.ts,
            )
        )
    elif isinstance(event, r.AttemptFinished):
        subtask, attempt = _attempt(state, event)
        attempt.finished_at = event.ts
        attempt.outcome = AttemptOutcome(
            ok=True,
            host=event.host,
            started_at_ms=attempt.deployed_at,
            finished_at_ms=event.ts,
            input_bytes=event.input_bytes,
            records=event.records,
            bytes_per_subpartition=tuple(event.bytes_per_subpartition),
            checksums=tuple(event.checksums),
        )
        subtask.win(attempt)
        # A sink's AttemptFinished follows its commit (`Outcomes._committed`).
        subtask.committed = state.vertices[event.vertex].definition.sink is not None
    elif isinstance(event, r.AttemptFailed):
        _, attempt = _attempt(state, event)
        attempt.status = AttemptStatus.FAILED
        attempt.finished_at = event.ts
        if event.missing_partition is not None:
            state.mark_unavailable(event.missing_partition)
    elif isinstance(event, r.AttemptCanceled):
        _, attempt = _attempt(state, event)
        # Whether its runner had stopped it yet or not, it ended for the job here: the new
        # driver's runners are new, and nothing of the dead driver's still runs for it.
        attempt.cancel_reason = event.reason.value
        attempt.status = AttemptStatus.CANCELED
        attempt.finished_at = event.ts
    elif isinstance(event, r.PartitionReleased):
        state.mark_unavailable(event.partition)
    elif isinstance(event, r.JobRecovered):
        # What an earlier recovery decided, which no other event records: the subtasks of the
        # attempts it reset run again (the AttemptCanceled after it end the attempts), and the
        # results it found lost stay lost (the AttemptFinished folded before no longer counts).
        for ref in event.reset_attempts:
            _reset(_subtask(state, event, ref.vertex, ref.subtask))
        for lost in event.lost_results:
            _lose(_subtask(state, event, lost.partition.vertex, lost.partition.subtask), lost)
    elif isinstance(event, r.NodeBlocked):
        rebuilt.blocks[event.host] = event.until_ts
    elif isinstance(event, r.NodeUnblocked):
        rebuilt.blocks.pop(event.host, None)
    elif isinstance(event, r.CommandApplied):
        rebuilt.handled.add(event.command_id)
        _command_effect(state, log, event)
    elif isinstance(event, r.CommandRejected) and not is_authority_rejection(event):
        # The driver counts an id as handled before its guard runs; a forgery's rejection
        # does not use up the id of the service's own command (`CommandApplier.on_command`).
        rebuilt.handled.add(event.command_id)


def _command_effect(state: ExecutionState, log: JobLog, applied: r.CommandApplied) -> None:
    """The part of a command's effect that no event of its own records: a restart resets the
    subtasks it names (`Actions.restart_task`); the cancellations follow as events. A broadcast
    join's `SetParallelism` makes its build side and its other side's layout (one unshuffled
    subpartition if it had not started: `ExecutionState.decide_broadcast`); its
    `VertexInitialized` holds only the join's ranges, so without this the other side would be
    hash-split while the join reads one subpartition of each partition: rows lost without an
    error. A failed job is over (its JobFinished may be what the crash lost)."""
    if applied.command_type == r.FailJob.__name__:
        raise RecoveryError(
            f"job {log.job_id} was failed by {applied.command_id} before its driver died: "
            "there is nothing to recover; run the job afresh under a new id"
        )
    if applied.command_type == r.SetParallelism.__name__ and state.broadcast_joins.joins:
        decision = _logged(
            log,
            applied.command_id,
            r.SetParallelism,
            "was applied",
            "whether it made a join a broadcast join cannot be rebuilt",
        )
        if decision.broadcast is not None:
            state.decide_broadcast(decision.vertex, decision.broadcast.input)
        return
    if applied.command_type != r.RestartTasks.__name__:
        return
    command = _logged(
        log, applied.command_id, r.RestartTasks, "was applied", "the restart cannot be rebuilt"
    )
    for task in command.tasks:
        subtask = state.subtask(task.vertex, task.subtask)
        if subtask is None:
            raise RecoveryError(f"job {log.job_id}: {command.id} restarts unknown task {task}")
        subtask.unfinish()  # as Actions.restart_task
        subtask.not_before = command.not_before_ts


def _logged(log: JobLog, command_id: str, kind: type[_C], did: str, lost: str) -> _C:
    """The command `command_id` of the log, of `kind`, whose effect the fold rebuilds; a
    RecoveryError saying what cannot be rebuilt when the log does not hold it."""
    command = log.commands.get(command_id)
    if not isinstance(command, kind):
        raise RecoveryError(
            f"job {log.job_id}: {kind.__name__} {command_id} {did}, but its log ({log.source}) "
            f"does not hold the command: {lost}"
        )
    return command


def _reset(subtask: Subtask) -> None:
    """An attempt of `subtask` was running when its driver died: it runs again, unless another
    attempt had finished it."""
    if subtask.winner is None:
        subtask.wanted = True


def _lose(subtask: Subtask, lost: r.LostResult) -> None:
    """A finished result found lost on a recovery (by `reconcile`, or read back from the
    `JobRecovered` that recorded it): nobody reads it, and its producer runs again if asked."""
    subtask.available = False
    if lost.produced_again:
        subtask.unfinish()


def _subtask(state: ExecutionState, event: r.Event, vertex: str, index: int) -> Subtask:
    """The subtask `event` names."""
    subtask = state.subtask(vertex, index)
    if subtask is None:
        raise RecoveryError(
            f"{event.id} names {vertex}#{index}, which the rebuilt job does not have (a "
            "VertexInitialized is missing from the log)"
        )
    return subtask


def _attempt(
    state: ExecutionState, event: r.AttemptFinished | r.AttemptFailed | r.AttemptCanceled
) -> tuple[Subtask, Attempt]:
    subtask = _subtask(state, event, event.vertex, event.subtask)
    if not 0 <= event.attempt < len(subtask.attempts):
        raise RecoveryError(
            f"{event.id} ends attempt {event.attempt} of {event.vertex}#{event.subtask}, "
            "which the log never deployed"
        )
    return subtask, subtask.attempts[event.attempt]


# ---------------------------------------------------------------------- reconciling results


def file_checksum(storage: Storage, path: str) -> str | None:
    """The checksum of a file as the writers take it (`partitions.checksum`), read in chunks;
    None when the file is missing or unreadable."""
    digest = hashlib.blake2b(digest_size=16)
    try:
        with storage.open_input(path) as handle:
            while chunk := handle.read(_HASH_CHUNK_BYTES):
                digest.update(chunk)
    except OSError:
        return None
    return digest.hexdigest()


def _result_files(
    state: ExecutionState, storage: Storage, job_id: str, subtask: Subtask
) -> Iterable[tuple[str, Storage, str]]:
    """(path, its storage, expected checksum) of each file a finished subtask left."""
    winner = subtask.winner
    assert winner is not None and winner.outcome is not None
    sink = state.vertices[subtask.vertex].definition.sink
    if sink is not None:
        # The committed part (what `_SUCCESS` will name); its checksum is the staged file's.
        target = Storage(sink.path)
        yield target.path(part_name(subtask.index)), target, winner.outcome.checksums[0]
        return
    ref = r.PartitionRef(subtask.vertex, subtask.index, winner.number)
    for sp, expected in enumerate(winner.outcome.checksums):
        yield partitions.subpartition_path(storage, job_id, ref, sp), storage, expected


def _still_needed(state: ExecutionState, producer: Subtask) -> bool:
    """Whether a consumer that has not finished reads this producer's partition (a sink's part
    is the job's output: always needed)."""
    if state.vertices[producer.vertex].definition.sink is not None:
        return True
    for consumer_name, _ in state.consumers[producer.vertex]:
        consumer = state.vertices[consumer_name]
        if not consumer.initialized:
            return True
        for subtask in consumer.subtasks:
            if subtask.winner is not None:
                continue
            for rng in subtask.inputs:
                if rng.input == producer.vertex and (
                    rng.partition_start <= producer.index <= rng.partition_end
                ):
                    return True
    return False


def _loss(files: Iterable[tuple[str, Storage, str]]) -> r.ResultLoss | None:
    """Why a finished result's files no longer verify; None when they all do. A missing file
    outweighs a mismatch (the result is gone, not merely damaged)."""
    found: r.ResultLoss | None = None
    for path, where, expected in files:
        actual = file_checksum(where, path)
        if actual is None:
            return r.ResultLoss.MISSING
        if actual != expected:
            found = r.ResultLoss.CHECKSUM_MISMATCH
    return found


def reconcile(state: ExecutionState, rebuilt: Recovered, storage: Storage, job_id: str) -> None:
    """Keep each finished result whose files still verify; a lost one is produced again when a
    consumer still needs it (Flink's reconcile with the shuffle master, then reset)."""
    for vertex in state.vertices.values():
        for subtask in vertex.subtasks:
            winner = subtask.winner
            if winner is None or not subtask.available:
                continue
            ref = r.PartitionRef(subtask.vertex, subtask.index, winner.number)
            loss = _loss(_result_files(state, storage, job_id, subtask))
            if loss is None:
                if vertex.definition.sink is not None:
                    rebuilt.kept_sink_parts.append(r.TaskRef(subtask.vertex, subtask.index))
                else:
                    rebuilt.kept_partitions.append(ref)
                continue
            lost = r.LostResult(ref, loss, produced_again=_still_needed(state, subtask))
            rebuilt.lost_results.append(lost)
            _lose(subtask, lost)
