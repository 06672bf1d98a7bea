"""The agent's driver loop: turns the job graph into attempts, facts into events, and commands
into changes.

One thread owns all state. Spark job threads, the command consumer and the tick timer only post
messages to its inbox, so every decision the agent takes happens in one order, which is the order
of the events it publishes.
"""

from __future__ import annotations

import logging
import queue
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tailguard.agent.driver import plans
from tailguard.agent.driver.commands import CommandValidator
from tailguard.agent.driver.result import AttemptSummary, RunResult
from tailguard.agent.driver.slots import SlotPool, SlotRequest
from tailguard.agent.driver.state import (
    Attempt,
    AttemptStatus,
    ExecutionState,
    Subtask,
    slot_requests,
)
from tailguard.agent.executor.attempt import AttemptOutcome
from tailguard.agent.executor.sources import Split, discover_splits
from tailguard.agent.executor.storage import Storage
from tailguard.agent.graph.api import Job
from tailguard.decider.policy import ParallelismDecider
from tailguard.failover.policy import FailoverStrategy
from tailguard.model import records as r
from tailguard.model.config import SERVICES_KEY, Settings
from tailguard.model.ids import event_id

log = logging.getLogger("tailguard.agent")


def new_job_id(job: Job) -> str:
    return f"{job.name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


class Runtime:
    """Where attempts run (the Spark runtime implements this)."""

    def executors(self) -> dict[str, int]:  # host -> slots
        raise NotImplementedError

    def submit(
        self, key: tuple[str, int, int], host: str, payload: Any, done: Callable[[Any], None]
    ) -> None:
        raise NotImplementedError

    def cancel(self, key: tuple[str, int, int]) -> None:
        raise NotImplementedError


class Publisher:
    """Where facts go (Kafka and the archive, or the archive alone)."""

    def publish(self, record: r.Record) -> None:
        raise NotImplementedError

    def received(self, record: r.Record) -> None:
        """A finding or command from the services (archived on arrival)."""
        raise NotImplementedError

    def local(self, record: r.Record) -> None:
        """A decision the agent made itself as a fallback."""
        raise NotImplementedError

    def close(self) -> None:
        pass


@dataclass
class _Pending:
    """A decision the agent computed locally, applied if no service sends it in time."""

    command: r.Command
    deadline: int
    what: str


@dataclass
class RunOptions:
    services: bool = True
    storage: Storage | None = None
    progress: bool = True
    # Test hooks that inject real failures: {(vertex, subtask, attempt): message}
    fail_attempts: dict[tuple[str, int, int], str] = field(default_factory=dict)
    # Called with each event after publishing (tests, the demo's live view).
    on_event: Callable[[r.Event], None] | None = None
    # Called once after JobSubmitted is published, with the runner (tests use it to act mid-job).
    on_start: Callable[[JobRunner], None] | None = None
    executor_wait_s: float = 60.0


class JobRunner:
    def __init__(
        self,
        job: Job,
        runtime: Runtime,
        publisher: Publisher,
        settings: Settings,
        options: RunOptions,
        job_id: str | None = None,
    ) -> None:
        self.job = job
        self.runtime = runtime
        self.publisher = publisher
        self.settings = settings
        self.options = options
        self.job_id = job_id or new_job_id(job)
        assert options.storage is not None, "RunOptions.storage is required"
        self.storage = options.storage
        self.state = ExecutionState(
            job,
            settings.integer("execution.batch.adaptive.auto-parallelism.max-parallelism"),
        )
        self.pool = SlotPool()
        self.inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.sequence = 0
        self.splits: dict[str, list[Split]] = {}
        self.decider = ParallelismDecider(settings)
        self.failover = FailoverStrategy(settings)
        self.validator = CommandValidator(self)
        self.pending: dict[str, _Pending] = {}
        self.applied: set[str] = set()
        self.fallback_notes: list[str] = []
        self.rejected: list[tuple[str, str, str]] = []
        self.blocks: list[tuple[str, int, int]] = []
        self.block_started: dict[str, int] = {}
        self.status: r.JobStatus | None = None
        self.message = ""
        self.started_ms = 0
        self.finished_ms = 0
        self.events_published = 0
        self.check_interval = settings.duration_ms("slow-task-detector.check-interval")
        self.decider_timeout = settings.duration_ms("decider.timeout")
        self.failover_timeout = settings.duration_ms("failover.timeout")
        self.max_concurrent = settings.integer(
            "execution.batch.speculative.max-concurrent-executions"
        )
        self._progress: Any = None

    # ================================================================ events

    def now(self) -> int:
        return int(time.time() * 1000)

    def emit(self, cls: type[r.Event], **fields: Any) -> r.Event:
        self.sequence += 1
        event = cls(
            job_id=self.job_id, ts=self.now(), id=event_id(self.job_id, self.sequence), **fields
        )
        self.publisher.publish(event)
        self.events_published += 1
        # The local cores see exactly what the services see.
        self._local_decisions(event)
        if self.options.on_event is not None:
            self.options.on_event(event)
        return event

    def _attempt_event(self, cls: type[r.Event], attempt: Attempt, **fields: Any) -> r.Event:
        """An event about one attempt (they all name it the same way)."""
        return self.emit(
            cls,
            vertex=attempt.vertex,
            subtask=attempt.subtask,
            attempt=attempt.number,
            host=attempt.host,
            **fields,
        )

    def _local_decisions(self, event: r.Event) -> None:
        for core, timeout, what in (
            (self.decider, self.decider_timeout, "parallelism"),
            (self.failover, self.failover_timeout, "failover"),
        ):
            for out in core.handle(event):
                assert isinstance(out, r.Command)
                if out.id in self.applied:
                    continue
                deadline = event.ts + (timeout if self.options.services else 0)
                self.pending[out.id] = _Pending(out, deadline, what)

    # ================================================================ lifecycle

    def run(self) -> RunResult:
        self.started_ms = self.now()
        try:
            self._start()
            self._loop()
        except BaseException as err:  # the job must end with a JobFinished, whatever happened
            if self.status is None:
                self._end(r.JobStatus.FAILED, f"agent error: {err!r}")
            raise
        finally:
            self._close()
        return self._result()

    def _start(self) -> None:
        split_bytes: dict[str, tuple[int, ...]] = {}
        for name, vertex in self.job.vertices.items():
            if vertex.source is not None:
                self.splits[name] = discover_splits(vertex.source)
                split_bytes[name] = tuple(s.bytes for s in self.splits[name])
        for vertex in self.job.vertices.values():
            if vertex.sink is not None:
                plans.prepare_sink(vertex.sink)
        spec = self.job.spec(split_bytes)
        # Whether the services run is part of the record: a replay must know which decisions
        # were made live and which only by the local fallbacks.
        config = {
            **self.settings.overrides(),
            SERVICES_KEY: "on" if self.options.services else "off",
        }
        self.emit(r.JobSubmitted, name=self.job.name, graph=spec, config=config)
        self._await_executors()
        self._refresh_nodes()
        if self.options.on_start is not None:
            self.options.on_start(self)
        self._initialize_static()

    def _await_executors(self) -> None:
        deadline = time.monotonic() + self.options.executor_wait_s
        while not self.runtime.executors():
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"no Spark executor registered within {self.options.executor_wait_s:.0f} s"
                )
            time.sleep(0.2)  # polling Spark's status tracker: it has no registration callback

    def _refresh_nodes(self) -> None:
        current = self.runtime.executors()
        for host, slots in sorted(current.items()):
            if self.pool.add_host(host, slots):
                self.emit(r.NodeAdded, host=host, slots=slots)
        for host in sorted(set(self.pool.hosts) - set(current)):
            self.pool.remove_host(host)
            self.emit(r.NodeRemoved, host=host, reason="executor lost")
            for attempt in self.state.live_attempts():
                if attempt.host == host:
                    self._attempt_ended(
                        attempt,
                        AttemptOutcome(
                            ok=False,
                            host=host,
                            started_at_ms=attempt.deployed_at,
                            finished_at_ms=self.now(),
                            error=r.ErrorKind.NODE_LOST,
                            message=f"executor on {host} lost",
                        ),
                    )

    def _loop(self) -> None:
        next_tick = self.now() + self.check_interval
        while self.status is None:
            self._apply_due_fallbacks()
            self._schedule()
            if self.state.all_done():
                self._succeed()
                break
            now = self.now()
            if now >= next_tick:
                self._tick()
                next_tick = now + self.check_interval
                continue
            try:
                kind, payload = self.inbox.get(timeout=max(0.0, (next_tick - now) / 1000.0))
            except queue.Empty:
                continue
            self._dispatch(kind, payload)
            # Drain what else arrived without waiting, before scheduling again.
            while self.status is None:
                try:
                    kind, payload = self.inbox.get_nowait()
                except queue.Empty:
                    break
                self._dispatch(kind, payload)

    def _dispatch(self, kind: str, payload: Any) -> None:
        if kind == "outcome":
            key, outcome = payload
            attempt = self._attempt(key)
            if attempt is not None:
                self._attempt_ended(attempt, outcome)
        elif kind == "command":
            self._on_command(payload)

    def _tick(self) -> None:
        self.emit(r.Tick)
        self._refresh_nodes()
        now = self.now()
        for host in self.pool.expired_blocks(now):
            self.pool.unblock(host)
            self.blocks.append((host, self.block_started.pop(host, now), now))
            self.emit(r.NodeUnblocked, host=host)
        self._update_progress()

    def post(self, kind: str, payload: Any) -> None:
        """Thread-safe entry for other threads (Spark callbacks, command consumer)."""
        self.inbox.put((kind, payload))

    # ================================================================ initialisation

    def _initialize_static(self) -> None:
        """Vertices with a fixed parallelism are initialised as soon as their inputs are;
        adaptive ones wait for SetParallelism (from the decider, or the local fallback)."""
        progress = True
        while progress:
            progress = False
            for name in self.state.vertices:
                vertex = self.state.vertices[name]
                if vertex.initialized or vertex.definition.parallelism is None:
                    continue
                inputs = plans.static_subtask_inputs(self.state, name, self.splits.get(name))
                if inputs is None:
                    continue
                self._initialize(name, vertex.definition.parallelism, inputs, "fixed", None)
                progress = True

    def _initialize(
        self,
        name: str,
        parallelism: int,
        inputs: tuple[r.SubtaskInputs, ...],
        by: str,
        command_id: str | None,
    ) -> None:
        self.state.initialize(name, parallelism, inputs, by)
        self.emit(
            r.VertexInitialized,
            vertex=name,
            parallelism=parallelism,
            subtask_inputs=inputs,
            decided_by=by,
            command_id=command_id,
        )
        self._initialize_static()

    # ================================================================ scheduling

    def _schedule(self) -> None:
        now = self.now()
        queued = {req.key for req in self.pool.pending()}
        for request in slot_requests(self.state, queued):
            if len(request.tasks) > 1 and not self.pool.could_ever_place(request):
                # FLIP-119 needs the largest region to fit; it waits in case executors join.
                log.warning(
                    "pipelined region %s needs %d slots, the cluster has %d: it waits for more",
                    request.key,
                    len(request.tasks),
                    self.pool.total_slots(),
                )
            self.pool.request(request)
        for request, placed in self.pool.assign(now):
            kind = request.key[0] if isinstance(request.key, tuple) else "task"
            if kind == "region":
                self._deploy_region(request, placed)
                continue
            for task, host in placed.items():
                vertex_name, index = task  # type: ignore[misc]
                subtask = self.state.subtask(vertex_name, index)
                if (
                    subtask is None
                    or (kind == "task" and not subtask.wanted)
                    or (subtask.winner is not None and kind != "task")
                ):
                    self.pool.release(host)
                    continue
                speculative = kind == "speculative"
                command_id = request.key[1] if speculative else None  # type: ignore[index]
                if not speculative:
                    subtask.wanted = False
                self._deploy(subtask, host, speculative, command_id)

    def _deploy_region(self, request: SlotRequest, placed: dict[object, str]) -> None:
        """Deploy a pipelined region's bulk at once, producers first (the request lists them in
        topological order), each consumer naming the producer attempts deployed with it."""
        tasks = tuple(request.tasks)
        region = self.state.region_of(*tasks[0])  # type: ignore[misc]
        if region is None or self.state.bulk_ready(region) != tasks:
            # The region changed while queued (a restart, a finished task): ask again.
            for host in placed.values():
                self.pool.release(host)
            return
        together: dict[tuple[str, int], int] = {}
        for subtask in self.state.subtasks_of(tasks):  # type: ignore[arg-type]
            subtask.wanted = False
            together[(subtask.vertex, subtask.index)] = self._deploy(
                subtask, placed[(subtask.vertex, subtask.index)], False, None, together
            )

    def _deploy(
        self,
        subtask: Subtask,
        host: str,
        speculative: bool,
        command_id: str | None,
        together: dict[tuple[str, int], int] | None = None,
    ) -> int:
        """Deploy a new attempt of `subtask` on `host`; returns its number."""
        number = subtask.next_number()
        attempt = Attempt(
            vertex=subtask.vertex,
            subtask=subtask.index,
            number=number,
            host=host,
            speculative=speculative,
            command_id=command_id,
            deployed_at=self.now(),
        )
        subtask.attempts.append(attempt)
        self._attempt_event(
            r.AttemptDeploying, attempt, speculative=speculative, command_id=command_id
        )
        spec = plans.task_spec(
            self.state,
            self.job_id,
            self.storage,
            subtask,
            number,
            self.splits.get(subtask.vertex, []),
            self.options.fail_attempts.get((subtask.vertex, subtask.index, number)),
            together,
        )
        key = attempt.key
        self.runtime.submit(
            key, host, spec, lambda outcome, key=key: self.post("outcome", (key, outcome))
        )
        return number

    def _attempt(self, key: tuple[str, int, int]) -> Attempt | None:
        subtask = self.state.subtask(key[0], key[1])
        if subtask is None or key[2] >= len(subtask.attempts):
            return None
        return subtask.attempts[key[2]]

    # ================================================================ outcomes

    def _attempt_ended(self, attempt: Attempt, outcome: Any) -> None:
        if attempt.status is not AttemptStatus.DEPLOYING:
            return
        self.pool.release(attempt.host)
        subtask = self.state.subtask(attempt.vertex, attempt.subtask)
        assert subtask is not None
        if not isinstance(outcome, AttemptOutcome):
            outcome = AttemptOutcome(
                ok=False,
                host=attempt.host,
                started_at_ms=attempt.deployed_at,
                finished_at_ms=self.now(),
                error=r.ErrorKind.INFRA,
                message=f"Spark job failed: {str(outcome)[:1500]}",
            )
        attempt.outcome = outcome
        attempt.finished_at = self.now()
        if attempt.cancel_reason is not None:
            attempt.status = AttemptStatus.CANCELED
            self._discard_output(attempt)
            return
        if outcome.ok and subtask.winner is None:
            self._won(subtask, attempt, outcome)
        elif outcome.ok:
            # Finished after the winner but before its cancellation took effect.
            attempt.status = AttemptStatus.CANCELED
            attempt.cancel_reason = r.CancelReason.LOST_RACE.value
            self._discard_output(attempt)
            self._attempt_event(
                r.AttemptCanceled,
                attempt,
                reason=r.CancelReason.LOST_RACE,
            )
        else:
            attempt.status = AttemptStatus.FAILED
            self._attempt_event(
                r.AttemptFailed,
                attempt,
                error=outcome.error or r.ErrorKind.INFRA,
                message=outcome.message,
                missing_partition=outcome.missing_partition,
            )
            if outcome.missing_partition is not None:
                self._mark_unavailable(outcome.missing_partition)

    def _won(self, subtask: Subtask, attempt: Attempt, outcome: AttemptOutcome) -> None:
        attempt.status = AttemptStatus.FINISHED
        subtask.winner = attempt
        subtask.available = True
        subtask.wanted = False
        vertex = self.state.vertices[subtask.vertex]
        if vertex.definition.sink is not None:
            try:
                plans.commit(self.storage, vertex.definition.sink, outcome.staged)
            except OSError as err:
                # The staged file is gone or changed: this attempt did not produce the output.
                subtask.winner = None
                subtask.available = False
                attempt.status = AttemptStatus.FAILED
                self._attempt_event(
                    r.AttemptFailed,
                    attempt,
                    error=r.ErrorKind.INFRA,
                    message=f"sink commit failed: {err}",
                    missing_partition=None,
                )
                return
            subtask.committed = True
        self._attempt_event(
            r.AttemptFinished,
            attempt,
            input_bytes=outcome.input_bytes,
            records=outcome.records,
            bytes_per_subpartition=tuple(outcome.bytes_per_subpartition),
            checksums=tuple(outcome.checksums),
        )
        for other in subtask.live_attempts():
            self._cancel(other, r.CancelReason.LOST_RACE)
        self.pool.cancel_task((subtask.vertex, subtask.index), "speculative")

    def _cancel(self, attempt: Attempt, reason: r.CancelReason) -> None:
        if not attempt.live:
            return
        attempt.cancel_reason = reason.value
        self.runtime.cancel(attempt.key)
        self._attempt_event(
            r.AttemptCanceled,
            attempt,
            reason=reason,
        )

    def _discard_output(self, attempt: Attempt) -> None:
        vertex = self.state.vertices[attempt.vertex]
        plans.discard(self.storage, self.job_id, vertex.definition, attempt)

    def _mark_unavailable(self, partition: r.PartitionRef) -> None:
        producer = self.state.subtask(partition.vertex, partition.subtask)
        winner = producer.winner if producer is not None else None
        if producer is not None and winner is not None and winner.number == partition.attempt:
            producer.available = False

    # ================================================================ commands

    def _on_command(self, command: r.Command) -> None:
        if command.job_id != self.job_id:
            return
        if command.id in self.applied:
            return  # each id at most once: a restarted service re-emits the same ids
        self.applied.add(command.id)
        self.pending.pop(command.id, None)
        self._apply(command, fallback=False)

    def _apply(self, command: r.Command, fallback: bool) -> None:
        kind = type(command).__name__
        reason = self.validator.reject_reason(command)
        if reason is not None:
            self.rejected.append((command.id, kind, reason))
            self.emit(r.CommandRejected, command_id=command.id, command_type=kind, reason=reason)
            return
        # Confirm before the effects, so the archive reads cause -> effect.
        self.emit(r.CommandApplied, command_id=command.id, command_type=kind)
        if isinstance(command, r.SetParallelism):
            by = "agent-fallback" if fallback else "decider"
            self._initialize(
                command.vertex, command.parallelism, command.subtask_inputs, by, command.id
            )
        elif isinstance(command, r.LaunchSpeculativeAttempts):
            subtask = self.state.subtask(command.vertex, command.subtask)
            assert subtask is not None
            avoid = frozenset(command.avoid_hosts) | {a.host for a in subtask.live_attempts()}
            for n in range(command.count):
                self.pool.request(
                    SlotRequest(
                        key=("speculative", command.id, n),
                        tasks=[(command.vertex, command.subtask)],
                        avoid={(command.vertex, command.subtask): avoid},
                    )
                )
        elif isinstance(command, r.BlockNodes):
            for host in command.hosts:
                self.block_started.setdefault(host, self.now())
                self.pool.block(host, command.until_ts)
                self.emit(
                    r.NodeBlocked,
                    host=host,
                    until_ts=command.until_ts,
                    cause=command.cause,
                    command_id=command.id,
                )
        elif isinstance(command, r.UnblockNodes):
            for host in command.hosts:
                if host in self.pool.blocked():
                    self.pool.unblock(host)
                    self.blocks.append((host, self.block_started.pop(host, self.now()), self.now()))
                    self.emit(r.NodeUnblocked, host=host, command_id=command.id)
        elif isinstance(command, r.RestartTasks):
            for task in command.tasks:
                subtask = self.state.subtask(task.vertex, task.subtask)
                assert subtask is not None
                for attempt in subtask.live_attempts():
                    self._cancel(attempt, r.CancelReason.RESTART)
                if subtask.winner is not None:
                    subtask.winner = None
                    subtask.available = False
                    subtask.committed = False
                subtask.wanted = True
                subtask.not_before = command.not_before_ts
        elif isinstance(command, r.FailJob):
            self._end(r.JobStatus.FAILED, command.reason)

    def _apply_due_fallbacks(self) -> None:
        if not self.pending:
            return
        now = self.now()
        for cid in [c for c, p in self.pending.items() if p.deadline <= now]:
            pending = self.pending.pop(cid)
            if cid in self.applied:
                continue
            self.applied.add(cid)
            why = "no service answered in time" if self.options.services else "services off"
            kind = type(pending.command).__name__
            note = f"{pending.what}: {why}, applied local {kind} {cid}"
            self.fallback_notes.append(note)
            log.info(note)
            self.publisher.local(pending.command)
            self._apply(pending.command, fallback=True)

    # ================================================================ the end

    def _succeed(self) -> None:
        for vertex in self.state.vertices.values():
            if vertex.definition.sink is not None:
                plans.finalize_sink(self.storage, vertex.definition.sink)
        self._end(r.JobStatus.SUCCEEDED, "")

    def _end(self, status: r.JobStatus, message: str) -> None:
        if self.status is not None:
            return
        for attempt in self.state.live_attempts():
            self._cancel(attempt, r.CancelReason.JOB_CANCELED)
        for vertex in self.state.vertices.values():
            if vertex.definition.sink is not None:
                continue
            for subtask in vertex.subtasks:
                if subtask.winner is not None and subtask.available:
                    subtask.available = False
                    self.emit(
                        r.PartitionReleased,
                        partition=r.PartitionRef(vertex.name, subtask.index, subtask.winner.number),
                    )
        plans.release_job(self.storage, self.job_id)
        for host in self.pool.blocked():
            self.blocks.append((host, self.block_started.pop(host, self.now()), self.now()))
        self.status = status
        # The job's own end: closing the publisher afterwards (draining late decisions into
        # the archive) is not job time.
        self.finished_ms = self.now()
        self.message = message
        self.emit(r.JobFinished, status=status, message=message)

    def _close(self) -> None:
        if self._progress is not None:
            self._progress.close()
        self.publisher.close()

    def _update_progress(self) -> None:
        if not self.options.progress:
            return
        done, known = self.state.counts()
        if self._progress is None:
            from tqdm import tqdm

            self._progress = tqdm(total=known, desc=self.job.name, unit="task", leave=False)
        self._progress.total = known
        self._progress.n = done
        live = self.state.live_attempts()
        self._progress.set_postfix(
            running=len(live), speculative=sum(1 for a in live if a.speculative), refresh=False
        )
        self._progress.refresh()

    def _result(self) -> RunResult:
        summaries = []
        for vertex in self.state.vertices.values():
            for subtask in vertex.subtasks:
                for a in subtask.attempts:
                    end = a.finished_at or self.now()
                    summaries.append(
                        AttemptSummary(
                            vertex=a.vertex,
                            subtask=a.subtask,
                            attempt=a.number,
                            host=a.host,
                            speculative=a.speculative,
                            status=a.status.value,
                            won=subtask.winner is a,
                            duration_ms=end - a.deployed_at,
                            cancel_reason=a.cancel_reason,
                            error=(
                                a.outcome.message
                                if a.outcome is not None and not a.outcome.ok
                                else None
                            ),
                        )
                    )
        return RunResult(
            job_id=self.job_id,
            status=(self.status or r.JobStatus.FAILED).value,
            message=self.message,
            started_ms=self.started_ms,
            finished_ms=self.finished_ms or self.now(),
            attempts=tuple(summaries),
            parallelism={
                v.name: (v.parallelism or 0, v.decided_by or "-")
                for v in self.state.vertices.values()
            },
            outputs={
                v.name: v.definition.sink.path
                for v in self.state.vertices.values()
                if v.definition.sink is not None
            },
            archive=getattr(self.publisher, "archive_path", None),
            blocked=tuple(self.blocks),
            commands_applied=len(self.applied) - len(self.rejected),
            commands_rejected=tuple(self.rejected),
            fallbacks=tuple(self.fallback_notes),
            events_published=self.events_published,
        )
