"""Fine-grained failover (FLIP-1) with Flink's restart strategies, as a pure core.

Events in, commands out. On a counted `AttemptFailed` the failed subtask's pipelined region
restarts (FLIP-119's regions are the failover regions), following FLIP-1's backtracking:

- upstream: a restarted region whose consumed partition is unavailable (released, or reported
  missing/corrupt) restarts that partition's producer region too, and so on further up;
- downstream: consumer regions that already consumed a restarted region's old output restart
  too (FLIP-1's conservative rule). With `failover.restart-consumers = unless-checksum-matches`
  (the default) a consumer that can still finish on the old data is instead checked when the
  producer's new result arrives, and restarts only if the subpartitions it read changed; a
  running consumer whose input is already gone restarts at once (FLIP-1's case 2).

Not counted as failovers: failures of attempts that were cancelled, of subtasks another attempt
already finished (lost races), of attempts from before a restart, and of a subtask with another
attempt still alive. Every counted failover consults the restart strategy once; when it says no
more, the job fails.

A failure that would recur wherever it runs (an import error, flagged by the executor; the same
USER error of a subtask from two hosts) fails the job at once without consulting the restart
strategy, as Flink's `ExecutionFailureHandler` does with `ThrowableType.NonRecoverableError`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from tailguard.failover.policy.backoff import restart_backoff
from tailguard.failover.policy.job import (
    AttemptState,
    DeferredCheck,
    JobState,
    Result,
    TaskState,
    read_slice,
)
from tailguard.model.config import ConfigError, Settings
from tailguard.model.ids import derived_id
from tailguard.model.records import (
    AttemptCanceled,
    AttemptDeploying,
    AttemptFailed,
    AttemptFinished,
    CommandApplied,
    ErrorKind,
    FailJob,
    JobFinished,
    JobRecovered,
    JobSubmitted,
    PartitionReleased,
    Record,
    RestartTasks,
    TaskRef,
    VertexInitialized,
)
from tailguard.model.topology import ExecutionTopology, GraphError, JobGraph

__all__ = ["FailoverStrategy"]

_PARTITION_ERRORS = (ErrorKind.PARTITION_MISSING, ErrorKind.PARTITION_CORRUPT)


class FailoverStrategy:
    SERVICE: ClassVar[str] = "failover"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.jobs: dict[str, JobState] = {}
        self._metrics: dict[str, float] = {
            "failovers": 0,
            "restarted_tasks": 0,
            "ignored_failures": 0,
            "deferred_checks": 0,
            "deferred_matched": 0,
            "deferred_restarts": 0,
            "jobs_failed": 0,
            "non_recoverable_failures": 0,
            "config_errors": 0,
        }

    def metrics(self) -> dict[str, float]:
        return {**self._metrics, "jobs": float(len(self.jobs))}

    # ------------------------------------------------------------ dispatch

    def handle(self, record: Record) -> list[Record]:
        if isinstance(record, JobSubmitted):
            self._submitted(record)
            return []
        job = self.jobs.get(record.job_id)
        if job is None:
            return []
        if isinstance(record, JobFinished):
            del self.jobs[record.job_id]
        elif isinstance(record, VertexInitialized):
            if record.vertex in job.graph.vertices and record.parallelism > 0:
                job.initialize(record.vertex, record.parallelism, record.subtask_inputs)
        elif isinstance(record, AttemptDeploying):
            state = job.task(TaskRef(record.vertex, record.subtask))
            state.attempts.setdefault(record.attempt, AttemptState.LIVE)
        elif isinstance(record, AttemptCanceled):
            job.task(TaskRef(record.vertex, record.subtask)).attempts[record.attempt] = (
                AttemptState.CANCELED
            )
        elif isinstance(record, PartitionReleased):
            job.released.add(record.partition)
        elif isinstance(record, JobRecovered):
            # A new driver found these results lost and produces them again: the subtasks are
            # unfinished, so a failure of the new attempt counts (else the old result hides it
            # and the job waits for ever).
            for lost in record.lost_results:
                if lost.produced_again:
                    job.task(TaskRef(lost.partition.vertex, lost.partition.subtask)).restart()
        elif isinstance(record, CommandApplied):
            for ref in job.restart_commands.pop(record.command_id, ()):
                job.task(ref).retire_known_attempts()
        elif isinstance(record, AttemptFinished):
            return self._finished(job, record)
        elif isinstance(record, AttemptFailed):
            return self._failed(job, record)
        return []

    def _submitted(self, event: JobSubmitted) -> None:
        try:
            graph = JobGraph(event.graph)
        except GraphError:
            return  # the agent rejects such a job itself; there is nothing to fail over
        settings = self.settings.for_job(event.config)
        try:
            backoff = restart_backoff(settings)
            mode = settings.text("failover.restart-consumers")
            if mode not in ("always", "unless-checksum-matches"):
                raise ConfigError(f"failover.restart-consumers: unknown value {mode!r}")
        except ConfigError:
            # A bad job setting must not stop the service; Flink's defaults are safe ones.
            self._metrics["config_errors"] += 1
            settings = self.settings
            backoff = restart_backoff(settings)
            mode = settings.text("failover.restart-consumers")
        self.jobs[event.job_id] = JobState(
            settings=settings,
            graph=graph,
            backoff=backoff,
            restart_consumers_always=mode == "always",
        )

    # ------------------------------------------------------------ attempts

    def _finished(self, job: JobState, event: AttemptFinished) -> list[Record]:
        ref = TaskRef(event.vertex, event.subtask)
        state = job.task(ref)
        state.attempts[event.attempt] = AttemptState.FINISHED
        if not state.is_current(event.attempt) or state.result is not None:
            return []  # a late finish of a retired attempt, or a loser of a race
        state.result = Result(event.attempt, event.checksums)
        checks = job.deferred.pop(ref, {})
        if job.failed or not checks:
            return []
        changed: dict[TaskRef, None] = {}
        causes: dict[str, None] = {}
        for check in checks.values():
            if job.task(check.consumer).generation != check.consumer_generation:
                continue  # the consumer was restarted meanwhile and reads the new data anyway
            if check.checksums and read_slice(event.checksums, check.subpartitions) == (
                check.checksums
            ):
                self._metrics["deferred_matched"] += 1
                continue
            changed[check.consumer] = None
            causes[check.cause] = None
        if not changed:
            return []
        topology = job.topology()
        starts = [
            topology.region_index(c.vertex, c.subtask)
            for c in changed
            if topology.contains(c.vertex, c.subtask)
        ]
        self._metrics["deferred_restarts"] += 1
        reason = (
            f"re-produced partition of {ref.vertex}[{ref.subtask}] (attempt {event.attempt}) "
            f"differs from what {len(changed)} consumer subtask(s) read"
        )
        command_id = derived_id(self.SERVICE, event.id, "consumers")
        return self._restart(job, event, starts, command_id, (*causes, event.id), reason, event.ts)

    def _failed(self, job: JobState, event: AttemptFailed) -> list[Record]:
        ref = TaskRef(event.vertex, event.subtask)
        state = job.task(ref)
        previous = state.attempts.get(event.attempt)
        state.attempts[event.attempt] = AttemptState.FAILED
        if event.error is ErrorKind.USER and previous is not AttemptState.CANCELED:
            # Evidence from any attempt of the subtask, a retired one too: all read the same
            # input. A cancelled attempt's error may be the cancellation's doing.
            state.user_errors.setdefault(event.message, set()).add(event.host)
        topology = job.topology()
        if (
            job.failed
            or previous is AttemptState.CANCELED
            or not state.is_current(event.attempt)
            or state.result is not None
            or not topology.contains(ref.vertex, ref.subtask)
        ):
            self._metrics["ignored_failures"] += 1
            return []
        unrecoverable = _recurs_anywhere(state, event)
        if unrecoverable is not None:
            # Flink's ExecutionFailureHandler: a NonRecoverableError fails the job without
            # notifying the restart strategy; another attempt still running would fail alike.
            self._metrics["non_recoverable_failures"] += 1
            return self._fail_job(job, event, f"not recoverable: {unrecoverable}")
        if state.live_attempts():
            # Another attempt of the subtask (a speculative one) may still finish it.
            return []
        starts = [topology.region_index(ref.vertex, ref.subtask)]
        missing = event.missing_partition
        if event.error in _PARTITION_ERRORS and missing is not None:
            job.report_damage(ref, missing)
            producer = TaskRef(missing.vertex, missing.subtask)
            if job.partition(producer) == missing and topology.contains(
                producer.vertex, producer.subtask
            ):
                starts.append(topology.region_index(producer.vertex, producer.subtask))
        not_before = job.backoff.on_failure(event.ts)
        self._metrics["failovers"] += 1
        if not_before is None:
            return self._fail_job(job, event, job.backoff.exhausted_reason())
        reason = f"{ref.vertex}[{ref.subtask}] attempt {event.attempt} failed ({event.error.value})"
        command_id = derived_id(self.SERVICE, event.id, "restart")
        return self._restart(job, event, starts, command_id, (event.id,), reason, not_before)

    def _fail_job(self, job: JobState, event: AttemptFailed, why: str) -> list[Record]:
        job.failed = True
        self._metrics["jobs_failed"] += 1
        reason = (
            f"{event.vertex}[{event.subtask}] attempt {event.attempt} failed "
            f"({event.error.value}: {event.message}); {why}"
        )
        return [
            FailJob(
                job_id=event.job_id,
                ts=event.ts,
                id=derived_id(self.SERVICE, event.id, "fail-job"),
                caused_by=(event.id,),
                reason=reason,
            )
        ]

    # ------------------------------------------------------------ planning

    def _restart(
        self,
        job: JobState,
        event: AttemptFailed | AttemptFinished,
        starts: list[int],
        command_id: str,
        caused_by: tuple[str, ...],
        reason: str,
        not_before: int,
    ) -> list[Record]:
        topology = job.topology()
        regions, candidates = self._plan(job, topology, starts)
        restarted = {t for r in regions for t in topology.regions()[r].tasks}
        produced = _by_vertex(t for t in restarted if job.task(t).result is not None)
        for region in sorted(candidates - regions):
            self._defer(job, topology, region, produced, event.id)
        tasks = tuple(sorted(restarted, key=lambda t: (job.graph.position(t.vertex), t.subtask)))
        for ref in tasks:
            job.task(ref).restart()
        job.restart_commands[command_id] = tasks
        self._metrics["restarted_tasks"] += len(tasks)
        return [
            RestartTasks(
                job_id=event.job_id,
                ts=event.ts,
                id=command_id,
                caused_by=caused_by,
                tasks=tasks,
                reason=f"{reason}: restarting {len(regions)} region(s), {len(tasks)} task(s)",
                not_before_ts=not_before,
            )
        ]

    def _plan(
        self, job: JobState, topology: ExecutionTopology, starts: Iterable[int]
    ) -> tuple[set[int], set[int]]:
        """FLIP-1's backtracking from `starts`: the regions to restart now, and the consumer
        regions whose restart waits for the re-produced partitions' checksums."""
        damaged = _by_vertex(job.damaged_producers())
        regions: set[int] = set()
        candidates: set[int] = set()
        work = sorted(set(starts), reverse=True)
        while work:
            region = work.pop()
            if region in regions:
                continue
            regions.add(region)
            members = topology.regions()[region].tasks
            for task in members:
                for producer in topology.consumed_among(task.vertex, task.subtask, damaged):
                    work.append(topology.region_index(producer.vertex, producer.subtask))
            for consumer in topology.region_consumers(region):
                consumers = topology.regions()[consumer].tasks
                if not any(job.task(t).has_run() for t in consumers):
                    continue  # not scheduled yet: it will read the new partitions
                if job.restart_consumers_always or self._input_lost(
                    job, topology, consumers, region, damaged
                ):
                    work.append(consumer)
                else:
                    candidates.add(consumer)
        return regions, candidates

    @staticmethod
    def _input_lost(
        job: JobState,
        topology: ExecutionTopology,
        members: Iterable[TaskRef],
        region: int,
        damaged: dict[str, list[int]],
    ) -> bool:
        """A running member reads a partition of `region` that is gone: it cannot finish."""
        for task in members:
            if not job.task(task).live_attempts():
                continue
            for producer in topology.consumed_among(task.vertex, task.subtask, damaged):
                if topology.region_index(
                    producer.vertex, producer.subtask
                ) == region and job.lost_for(task, producer):
                    return True
        return False

    def _defer(
        self,
        job: JobState,
        topology: ExecutionTopology,
        region: int,
        produced: dict[str, list[int]],
        cause: str,
    ) -> None:
        """Remember, for each restarted producer the region's consumers read, what they read."""
        for consumer in topology.regions()[region].tasks:
            consumer_state = job.task(consumer)
            if not consumer_state.has_run():
                continue
            for producer in topology.consumed_among(consumer.vertex, consumer.subtask, produced):
                result = job.task(producer).result
                assert result is not None
                pending = job.deferred.setdefault(producer, {})
                key = (consumer, consumer_state.generation)
                if key in pending:
                    continue  # keep the first check: it holds the data the consumer read
                subpartitions = job.subpartitions_read(consumer, producer)
                pending[key] = DeferredCheck(
                    consumer=consumer,
                    consumer_generation=consumer_state.generation,
                    subpartitions=subpartitions,
                    checksums=read_slice(result.checksums, subpartitions),
                    cause=cause,
                )
                self._metrics["deferred_checks"] += 1


def _recurs_anywhere(state: TaskState, event: AttemptFailed) -> str | None:
    """Why restarting the failed subtask would only use up the restart strategy, or None.

    - The executor classified the error as one that recurs wherever it runs (an import error:
      `AttemptFailed.non_recoverable`, Flink's `ThrowableType.NonRecoverableError`).
    - The same USER error (equal messages) from two hosts for this subtask: every attempt of a
      subtask reads the same input (deterministic split assignment, fixed ranges), so an error
      that followed the data to another host is the data's or the code's, not the host's.
      Exact equality errs towards restarting: a message that varies by host is not matched.
    """
    if event.non_recoverable:
        return "the error recurs wherever the task runs (an import error)"
    if event.error is ErrorKind.USER:
        hosts = state.user_errors.get(event.message, set())
        if len(hosts) >= 2:
            return f"the same error on {len(hosts)} hosts ({', '.join(sorted(hosts))})"
    return None


def _by_vertex(tasks: Iterable[TaskRef]) -> dict[str, list[int]]:
    grouped: dict[str, list[int]] = {}
    for task in sorted(tasks, key=lambda t: (t.vertex, t.subtask)):
        grouped.setdefault(task.vertex, []).append(task.subtask)
    return grouped
