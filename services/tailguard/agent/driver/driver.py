"""The agent's driver loop: turns the chained job graph into attempts deployed to slot runners,
facts into events, and commands into changes.

One thread owns all state. Runner connections, Spark's runner jobs and the command consumer only
post typed messages to its inbox, so every decision the agent takes happens in one order, which
is the order of the events it publishes.
"""

from __future__ import annotations

import logging
import queue
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tailguard.agent.driver import plans, recovery
from tailguard.agent.driver.commands import handler_for
from tailguard.agent.driver.fallbacks import LocalFallbacks
from tailguard.agent.driver.ordering import order_requests, subtask_order
from tailguard.agent.driver.ports import (
    AgentThreadFailed,
    CommandReceived,
    FromRunner,
    InboxMessage,
    Publisher,
    RunnerConnected,
    RunnerLost,
    Runtime,
)
from tailguard.agent.driver.result import AttemptSummary, RecoverySummary, RunResult
from tailguard.agent.driver.slots import (
    ExecutionVertexId,
    RegionRequest,
    Slot,
    SlotPool,
    SlotRequest,
    SpeculativeRequest,
)
from tailguard.agent.driver.state import (
    Attempt,
    AttemptStatus,
    ExecutionState,
    Subtask,
    slot_requests,
)
from tailguard.agent.executor.attempt import AttemptOutcome
from tailguard.agent.executor.environment import ExecutorEnvironmentError
from tailguard.agent.executor.protocol import AttemptEnded, AttemptProgressed, AttemptStarted
from tailguard.agent.executor.sources import Split, discover_splits
from tailguard.agent.executor.storage import Storage
from tailguard.agent.fleet_blocks import apply_fleet_list
from tailguard.agent.graph.api import Job
from tailguard.agent.graph.chaining import ChainedJob, chain
from tailguard.model import records as r
from tailguard.model.authority import authority_problem
from tailguard.model.config import SERVICES_KEY, Settings, recorded_config
from tailguard.model.fleet import FleetBlock
from tailguard.model.ids import event_id

log = logging.getLogger("tailguard.agent")

# How long the job's start waits for the rest of the runners once the first has connected.
RUNNER_START_GRACE_S = 10.0


def new_job_id(job: Job) -> str:
    return f"{job.name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


@dataclass
class RunOptions:
    services: bool = True
    storage: Storage | None = None
    progress: bool = True
    # Test hooks that inject real failures: {(chain, subtask, attempt): message}
    fail_attempts: dict[tuple[str, int, int], str] = field(default_factory=dict)
    # Called with each event after publishing (tests, the demo's live view).
    on_event: Callable[[r.Event], None] | None = None
    # Called once after JobSubmitted is published, with the driver (tests use it to act mid-job).
    on_start: Callable[[JobDriver], None] | None = None
    executor_wait_s: float = 60.0
    # Reads the fleet blocklist's changes (tailguard.agent.fleet_blocks); None: not read.
    fleet_list: Callable[[], list[FleetBlock]] | None = None


@dataclass
class _Dispatch:
    """Driver-side timings of one attempt, for the dispatch overhead."""

    sent: float
    running: float | None = None


class JobDriver:
    def __init__(
        self,
        job: Job,
        runtime: Runtime,
        publisher: Publisher,
        settings: Settings,
        options: RunOptions,
        job_id: str | None = None,
        inbox: queue.Queue[InboxMessage] | None = None,
        recover: recovery.JobLog | None = None,
    ) -> None:
        """`recover`: the log of this job's dead driver; the job is taken over from where it
        stopped (`agent/driver/recovery.py`) instead of started."""
        self.job = job
        self.graph: ChainedJob = chain(job)
        self.runtime = runtime
        self.publisher = publisher
        self.settings = settings
        self.options = options
        self.job_id = job_id or new_job_id(job)
        if recover is not None and recover.job_id != self.job_id:
            raise recovery.RecoveryError(
                f"the log given is job {recover.job_id}'s, not {self.job_id}'s"
            )
        self._recover_from = recover
        self._recovered: recovery.Recovered | None = None
        assert options.storage is not None, "RunOptions.storage is required"
        self.storage = options.storage
        self._state = ExecutionState(
            self.graph,
            settings.integer("execution.batch.adaptive.auto-parallelism.max-parallelism"),
        )
        self._pool = SlotPool()
        self.inbox: queue.Queue[InboxMessage] = inbox if inbox is not None else queue.Queue()
        self.sequence = 0
        self.splits: dict[str, list[Split]] = {}
        self.fallbacks = LocalFallbacks(settings, options.services)
        self.applied: set[str] = set()
        self.fallback_notes: list[str] = []
        self.rejected: list[tuple[str, str, str]] = []
        self.commands_taken = 0
        self.blocks: list[tuple[str, int, int]] = []
        self.block_started: dict[str, int] = {}
        self.status: r.JobStatus | None = None
        self.message = ""
        self.started_ms = 0
        self.finished_ms = 0
        self.events_published = 0
        self.check_interval = settings.duration_ms("slow-task-detector.check-interval")
        self._batch_rows = plans.batch_rows(settings)
        self._max_concurrent = settings.integer(
            "execution.batch.speculative.max-concurrent-executions"
        )
        self._max_blocked_fraction = settings.number("blocklist.max-blocked-fraction")
        self._subtask_order = subtask_order(settings)
        self._attempt_on_slot: dict[str, Attempt] = {}
        self._dispatch: dict[tuple[str, int, int], _Dispatch] = {}
        self.dispatch_ms: list[float] = []
        self.deploy_to_running_ms: list[float] = []
        self.runners_lost = 0
        self._first_runner_at = 0.0
        self._progress: Any = None
        self._handlers: Mapping[type, Callable[[Any], None]] = {
            RunnerConnected: self._on_runner_connected,
            RunnerLost: self._on_runner_lost,
            FromRunner: self._on_runner_report,
            CommandReceived: self._on_command,
            AgentThreadFailed: self._on_thread_failed,
        }

    # ================================================================ the views commands use

    @property
    def state(self) -> ExecutionState:
        return self._state

    @property
    def pool(self) -> SlotPool:
        return self._pool

    @property
    def split_counts(self) -> Mapping[str, int]:
        return {name: len(splits) for name, splits in self.splits.items()}

    @property
    def max_concurrent(self) -> int:
        return self._max_concurrent

    @property
    def max_blocked_fraction(self) -> float:
        return self._max_blocked_fraction

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
        self.fallbacks.observe(event)
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

    def post(self, message: InboxMessage) -> None:
        """Thread-safe entry for other threads (runner connections, the command consumer)."""
        self.inbox.put(message)

    # ================================================================ lifecycle

    def run(self) -> RunResult:
        self.started_ms = self.now()
        try:
            self._start()
            self._loop()
        except recovery.RecoveryError:
            # Refused before anything was recorded: the job stays recoverable as it was.
            raise
        except ExecutorEnvironmentError as err:
            # Found before any attempt ran: every attempt would fail the same way, anywhere.
            log.error("job %s: %s", self.job_id, err)
            self._end(r.JobStatus.FAILED, str(err))
        except Exception as err:  # the job ends with a JobFinished and a result, whatever happened
            log.exception("agent error in job %s", self.job_id)
            self._end(r.JobStatus.FAILED, f"agent error: {err!r}")
        except BaseException:  # Ctrl-C or interpreter exit: record the end, then let it go
            self._end(r.JobStatus.CANCELED, "interrupted")
            raise
        finally:
            self._close()
        return self._result()

    def _start(self) -> None:
        split_bytes: dict[str, tuple[int, ...]] = {}
        for name, vertex in self.graph.vertices.items():
            if vertex.source is not None:
                self.splits[name] = discover_splits(vertex.source)
                split_bytes[name] = tuple(s.bytes for s in self.splits[name])
        spec = self.graph.spec(split_bytes)
        if self._recover_from is not None:
            self._take_over(self._recover_from, spec)
        else:
            for vertex in self.graph.vertices.values():
                if vertex.sink is not None:
                    plans.prepare_sink(vertex.sink)
            # Whether the services run is part of the record: a replay must know which
            # decisions were made live and which only by the local fallbacks. Only policy
            # settings and markers are recorded, never connection settings or their secrets.
            config = recorded_config(
                {
                    **self.settings.overrides(),
                    SERVICES_KEY: "on" if self.options.services else "off",
                }
            )
            self.emit(r.JobSubmitted, name=self.job.name, graph=spec, config=config)
        launched = self.runtime.start(self.job_id, self.post)
        self._await_runners(launched)
        if self._recovered is not None:
            now = self.now()
            for host, until in sorted(self._recovered.blocks.items()):
                # Still blocked for the services; one whose time is up is lifted at the tick.
                self.block_started[host] = now
                self._pool.block(host, until)
        if self.options.fleet_list is not None:  # before any attempt is placed
            # After the recovered blocks: the job's cap counts them.
            apply_fleet_list(self, self.options.fleet_list)
        if self.options.on_start is not None:
            self.options.on_start(self)
        self._initialize_static()

    def _take_over(self, job_log: recovery.JobLog, spec: r.JobGraphSpec) -> None:
        """Rebuild the dead driver's state from its log, check what it finished, and record
        what was lost with it; the sinks keep their committed parts (no `prepare_sink`)."""
        rebuilt = recovery.rebuild(self._state, job_log)
        if rebuilt.submitted.graph != spec:
            raise recovery.RecoveryError(
                f"job {self.job_id}: the job given is not the one its log recorded (the graph "
                "or its input splits differ): recover it with the same job file, parameters "
                "and input"
            )
        recovery.reconcile(self._state, rebuilt, self.storage, self.job_id)
        self._recovered = rebuilt
        self.sequence = rebuilt.last_sequence
        # Handled ids stay handled; the local cores see the job's history as the services did,
        # so a decision pending at the crash is still taken (under the id the service gives it).
        self.applied = set(rebuilt.handled)
        for command_id in rebuilt.handled:
            self.fallbacks.settle(command_id)
        for event in rebuilt.events:
            self.fallbacks.observe(event)
        log.info(
            "job %s recovered from %s: %d result(s) kept, %d attempt(s) lost with the driver, "
            "%d result(s) lost (%d to produce again)",
            self.job_id,
            job_log.source,
            rebuilt.kept_results,
            len(rebuilt.lost_attempts),
            len(rebuilt.lost_results),
            len(rebuilt.rerun_partitions),
        )
        # Before anything else: the log says where this driver took over, and with what.
        self.emit(r.JobRecovered, **rebuilt.marker(job_log.source))
        # The services still time the lost attempts as running: end them for everyone.
        for attempt in rebuilt.lost_attempts:
            self._attempt_event(r.AttemptCanceled, attempt, reason=r.CancelReason.RESTART)
        for lost in rebuilt.lost_results:
            if self._state.vertices[lost.partition.vertex].definition.sink is None:
                self.emit(r.PartitionReleased, partition=lost.partition)

    def _await_runners(self, launched: int) -> None:
        """Wait until the runners launched at start have all reported (connected, or ended),
        so the first placements see the whole cluster; a straggling runner (a slow or
        throttled node) delays the start by at most `RUNNER_START_GRACE_S` after the first
        one connected, and joins the pool when it arrives."""
        deadline = time.monotonic() + self.options.executor_wait_s
        reported = 0
        while reported < launched or not self._pool.hosts:
            if self._pool.hosts:
                deadline = min(deadline, self._first_runner_at + RUNNER_START_GRACE_S)
            left = deadline - time.monotonic()
            if left <= 0:
                if self._pool.hosts:
                    return
                raise RuntimeError(
                    f"no slot runner connected within {self.options.executor_wait_s:.0f} s "
                    f"({self.runners_lost} runner(s) ended before connecting; see the log)"
                )
            try:
                message = self.inbox.get(timeout=left)
            except queue.Empty:
                continue
            if isinstance(message, RunnerConnected | RunnerLost):
                reported += 1
                if isinstance(message, RunnerConnected) and not self._pool.hosts:
                    self._first_runner_at = time.monotonic()
            self._dispatch_message(message)

    def _loop(self) -> None:
        next_tick = self.now() + self.check_interval
        while self.status is None:
            self._apply_due_fallbacks()
            self._schedule()
            if self._state.all_done():
                self._succeed()
                break
            now = self.now()
            if now >= next_tick:
                self._tick()
                next_tick = now + self.check_interval
                continue
            wake = next_tick
            deadline = self.fallbacks.next_deadline()
            if deadline is not None:
                wake = min(wake, max(deadline, now))
            try:
                message = self.inbox.get(timeout=max(0.0, (wake - now) / 1000.0))
            except queue.Empty:
                continue
            self._dispatch_message(message)
            # Drain what else arrived without waiting, before scheduling again.
            while self.status is None:
                try:
                    message = self.inbox.get_nowait()
                except queue.Empty:
                    break
                self._dispatch_message(message)

    def _dispatch_message(self, message: InboxMessage) -> None:
        self._handlers[type(message)](message)

    def _tick(self) -> None:
        self.emit(r.Tick)
        self.runtime.ensure_runners()
        now = self.now()
        for host in self._pool.expired_blocks(now):
            self.unblock_host(host, None)
        self._update_progress()

    # ================================================================ runners

    def _on_thread_failed(self, message: AgentThreadFailed) -> None:
        # Raised here, on the driver's thread: `run` fails the job with it (JobFinished FAILED).
        raise RuntimeError(
            f"agent thread {message.thread} died: {message.error!r}"
        ) from message.error

    def _on_runner_connected(self, message: RunnerConnected) -> None:
        if self._pool.add_slot(message.host, message.slot):
            self.emit(r.NodeAdded, host=message.host, slots=message.host_slots)

    def _on_runner_lost(self, message: RunnerLost) -> None:
        self.runners_lost += 1
        attempt = self._attempt_on_slot.pop(message.slot, None)
        host, host_gone = self._pool.remove_slot(message.slot)
        if attempt is not None:
            attempt.slot = None
            self._attempt_ended(
                attempt,
                AttemptOutcome(
                    ok=False,
                    host=attempt.host,
                    started_at_ms=attempt.deployed_at,
                    finished_at_ms=self.now(),
                    error=r.ErrorKind.NODE_LOST,
                    message=f"slot runner {message.slot} lost: {message.reason}",
                ),
            )
        if host is not None and host_gone:
            self.emit(r.NodeRemoved, host=host, reason=message.reason)
        if host is not None and self.status is None:
            # A runner that ended with its executor still there (a cancelled attempt that
            # ignored the flag, a crashed worker process) is replaced at once.
            self.runtime.ensure_runners()

    def _on_runner_report(self, message: FromRunner) -> None:
        report = message.message
        attempt = self._attempt_on_slot.get(message.slot)
        if attempt is None or attempt.key != report.key:
            return  # about an attempt this slot no longer holds (it was lost and replaced)
        timing = self._dispatch.get((attempt.vertex, attempt.subtask, attempt.number))
        if isinstance(report, AttemptStarted):
            if timing is not None and timing.running is None:
                timing.running = message.received
                self.deploy_to_running_ms.append((message.received - timing.sent) * 1000.0)
        elif isinstance(report, AttemptProgressed):
            if attempt.live:
                self._attempt_event(
                    r.AttemptProgress,
                    attempt,
                    records_read=report.records_read,
                    bytes_read=report.bytes_read,
                    bytes_total=report.bytes_total,
                )
        elif isinstance(report, AttemptEnded):
            if timing is not None:
                round_trip = (message.received - timing.sent) * 1000.0
                self.dispatch_ms.append(max(0.0, round_trip - report.run_ms))
            del self._attempt_on_slot[message.slot]
            self._pool.release(message.slot)
            attempt.slot = None
            self._attempt_ended(attempt, report.outcome)

    # ================================================================ initialisation

    def _initialize_static(self) -> None:
        """Vertices with a fixed parallelism are initialised as soon as their inputs are;
        adaptive ones wait for SetParallelism (from the decider, or the local fallback)."""
        progress = True
        while progress:
            progress = False
            for name in self._state.vertices:
                vertex = self._state.vertices[name]
                if vertex.initialized or vertex.definition.parallelism is None:
                    continue
                inputs = plans.static_subtask_inputs(self._state, name, self.splits.get(name))
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
        self._state.initialize(name, parallelism, inputs, by)
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
        queued = self._pool.queued_keys()
        fresh = order_requests(
            slot_requests(self._state, queued),
            lambda task: plans.subtask_input_bytes(self._state, task, self.splits.get(task.vertex)),
            self._subtask_order,
        )
        for request in fresh:
            if len(request.tasks) > 1 and not self._pool.could_ever_place(request):
                # FLIP-119 needs the largest region to fit; it waits in case executors join.
                log.warning(
                    "pipelined region %s needs %d slots, the cluster has %d: it waits for more",
                    request.key,
                    len(request.tasks),
                    self._pool.total_slots(),
                )
            self._pool.request(request)
        # A request made stale while it waited (a restart, a winner, an input being
        # re-produced) is dropped without a slot; a fresh request follows when it is due.
        for request, placed in self._pool.assign(self.now(), self._still_wanted):
            if isinstance(request.key, RegionRequest):
                self._deploy_region(request, placed)
                continue
            task, slot = next(iter(placed.items()))
            subtask = self._state.subtask(*task)
            assert subtask is not None, f"a request for unknown task {task}"
            if isinstance(request.key, SpeculativeRequest):
                self._deploy(subtask, slot, True, request.key.command_id)
            else:
                subtask.wanted = False
                self._deploy(subtask, slot, False, None)

    def _still_wanted(self, request: SlotRequest) -> bool:
        if isinstance(request.key, RegionRequest):
            region = self._state.region_of(*request.tasks[0])
            return region is not None and self._state.bulk_ready(region) == tuple(request.tasks)
        subtask = self._state.subtask(*request.tasks[0])
        if subtask is None:
            return False
        if isinstance(request.key, SpeculativeRequest):
            return (
                subtask.winner is None
                and bool(subtask.live_attempts())
                and self._state.inputs_available(subtask)
            )
        return self._state.deployable(subtask)

    def _deploy_region(self, request: SlotRequest, placed: dict[ExecutionVertexId, Slot]) -> None:
        """Deploy a pipelined region's bulk at once, producers first (the request lists them in
        topological order), each consumer naming the producer attempts deployed with it."""
        tasks = tuple(request.tasks)
        region = self._state.region_of(*tasks[0])
        if region is None or self._state.bulk_ready(region) != tasks:
            # The region changed while queued (a restart, a finished task): ask again.
            for slot in placed.values():
                self._pool.release(slot.slot_id)
            return
        together: dict[ExecutionVertexId, int] = {}
        for subtask in self._state.subtasks_of(tasks):
            subtask.wanted = False
            task = ExecutionVertexId(subtask.vertex, subtask.index)
            together[task] = self._deploy(subtask, placed[task], False, None, together)

    def _deploy(
        self,
        subtask: Subtask,
        slot: Slot,
        speculative: bool,
        command_id: str | None,
        together: dict[ExecutionVertexId, int] | None = None,
    ) -> int:
        """Deploy a new attempt of `subtask` to `slot`; returns its number."""
        number = subtask.next_number()
        spec = plans.task_spec(
            self._state,
            self.job_id,
            self.storage,
            subtask,
            number,
            self.splits.get(subtask.vertex, []),
            self.options.fail_attempts.get((subtask.vertex, subtask.index, number)),
            together,
            self._batch_rows,
        )
        attempt = Attempt(
            vertex=subtask.vertex,
            subtask=subtask.index,
            number=number,
            host=slot.host,
            speculative=speculative,
            command_id=command_id,
            deployed_at=self.now(),
            slot=slot.slot_id,
        )
        subtask.attempts.append(attempt)
        self._attempt_event(
            r.AttemptDeploying, attempt, speculative=speculative, command_id=command_id
        )
        self._attempt_on_slot[slot.slot_id] = attempt
        self._dispatch[(attempt.vertex, attempt.subtask, number)] = _Dispatch(time.perf_counter())
        self.runtime.deploy(slot.slot_id, spec)
        return number

    # ================================================================ outcomes

    def _attempt_ended(self, attempt: Attempt, outcome: AttemptOutcome) -> None:
        if attempt.status is not AttemptStatus.DEPLOYING:
            return
        subtask = self._state.subtask(attempt.vertex, attempt.subtask)
        assert subtask is not None
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
            self._attempt_event(r.AttemptCanceled, attempt, reason=r.CancelReason.LOST_RACE)
        else:
            attempt.status = AttemptStatus.FAILED
            self._attempt_event(
                r.AttemptFailed,
                attempt,
                error=outcome.error or r.ErrorKind.INFRA,
                message=outcome.message,
                missing_partition=outcome.missing_partition,
                non_recoverable=outcome.non_recoverable,
            )
            if outcome.missing_partition is not None:
                self._state.mark_unavailable(outcome.missing_partition)

    def _won(self, subtask: Subtask, attempt: Attempt, outcome: AttemptOutcome) -> None:
        subtask.win(attempt)
        vertex = self._state.vertices[subtask.vertex]
        if vertex.definition.sink is not None:
            try:
                assert outcome.staged is not None, "a sink attempt reports what it staged"
                plans.commit(self.storage, vertex.definition.sink, outcome.staged)
            except OSError as err:
                # The staged file is gone or changed: this attempt did not produce the output.
                subtask.unfinish()
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
        self._pool.cancel_speculative(ExecutionVertexId(subtask.vertex, subtask.index))

    def _cancel(self, attempt: Attempt, reason: r.CancelReason) -> None:
        if not attempt.live:
            return
        attempt.cancel_reason = reason.value
        if attempt.slot is not None:
            self.runtime.cancel(attempt.slot, attempt.key)
        self._attempt_event(r.AttemptCanceled, attempt, reason=reason)

    def _discard_output(self, attempt: Attempt) -> None:
        vertex = self._state.vertices[attempt.vertex]
        plans.discard(self.storage, self.job_id, vertex.definition, attempt)

    # ================================================================ commands

    def _on_command(self, message: CommandReceived) -> None:
        command = message.command
        if command.job_id != self.job_id:
            return
        # Before the id counts as handled: decision ids are predictable, and a forged command
        # must not use up the id of the service's own, nor settle a pending fallback.
        problem = authority_problem(command, message.origin)
        if problem is not None:
            log.warning(
                "rejected %s %s: %s",
                type(command).__name__,
                command.id,
                problem,
                extra={"record_id": command.id},
            )
            self._reject(command, problem)
            return
        if command.id in self.applied:
            return  # each id at most once: a restarted service re-emits the same ids
        self.applied.add(command.id)
        self.fallbacks.settle(command.id)
        self._apply(command, fallback=False)

    def _apply(self, command: r.Command, fallback: bool) -> None:
        kind = type(command).__name__
        handler = handler_for(command)
        try:
            reason = (
                f"unknown command type {kind}" if handler is None else handler.guard(command, self)
            )
        except Exception as err:  # a guard that trips over the command rejects it
            log.exception("checking %s %s", kind, command.id, extra={"record_id": command.id})
            reason = f"invalid command: {err!r}"
        if reason is not None or handler is None:
            self._reject(command, reason or "no handler")
            return
        # Confirm before the effects, so the archive reads cause -> effect.
        self.emit(r.CommandApplied, command_id=command.id, command_type=kind)
        try:
            handler.apply(command, self, fallback)
        except Exception as err:
            # The guard let through a command the state could not take: say so and go on.
            log.exception("applying %s %s", kind, command.id, extra={"record_id": command.id})
            self._reject(command, f"failed while applying: {err!r}")
            return
        self.commands_taken += 1

    def _reject(self, command: r.Command, reason: str) -> None:
        kind = type(command).__name__
        self.rejected.append((command.id, kind, reason))
        self.emit(r.CommandRejected, command_id=command.id, command_type=kind, reason=reason)

    def _apply_due_fallbacks(self) -> None:
        for due in self.fallbacks.due(self.now()):
            if due.command.id in self.applied:
                continue
            self.applied.add(due.command.id)
            self.fallback_notes.append(due.note)
            log.info(due.note, extra={"record_id": due.command.id})
            self.publisher.local(due.command)
            self._apply(due.command, fallback=True)

    # ---------------------------------------------------------------- JobActions

    def initialize_vertex(
        self,
        name: str,
        parallelism: int,
        inputs: tuple[r.SubtaskInputs, ...],
        by: str,
        command_id: str,
    ) -> None:
        self._initialize(name, parallelism, inputs, by, command_id)

    def request_speculative(
        self, task: ExecutionVertexId, command_id: str, count: int, avoid: frozenset[str]
    ) -> None:
        for n in range(count):
            self._pool.request(
                SlotRequest(
                    key=SpeculativeRequest(task, command_id, n),
                    tasks=[task],
                    avoid={task: avoid},
                )
            )

    def block_host(self, host: str, until_ts: int, cause: str, command_id: str) -> None:
        self.block_started.setdefault(host, self.now())
        self._pool.block(host, until_ts)
        self.emit(r.NodeBlocked, host=host, until_ts=until_ts, cause=cause, command_id=command_id)

    def unblock_host(self, host: str, command_id: str | None) -> None:
        now = self.now()
        self._pool.unblock(host)
        self.blocks.append((host, self.block_started.pop(host, now), now))
        self.emit(r.NodeUnblocked, host=host, command_id=command_id)

    def restart_task(self, task: ExecutionVertexId, not_before_ts: int) -> None:
        subtask = self._state.subtask(*task)
        assert subtask is not None, f"restart of unknown task {task}"
        for attempt in subtask.live_attempts():
            self._cancel(attempt, r.CancelReason.RESTART)
        subtask.unfinish()
        subtask.not_before = not_before_ts
        # Queued requests were made against the old state: drop them, fresh ones follow.
        self._pool.cancel_speculative(task)

    def fail_job(self, reason: str) -> None:
        self._end(r.JobStatus.FAILED, reason)

    # ================================================================ the end

    def _succeed(self) -> None:
        for vertex in self._state.vertices.values():
            if vertex.definition.sink is not None:
                plans.finalize_sink(self.storage, vertex.definition.sink)
        self._end(r.JobStatus.SUCCEEDED, "")

    def _end(self, status: r.JobStatus, message: str) -> None:
        if self.status is not None:
            return
        try:
            for attempt in self._state.live_attempts():
                self._cancel(attempt, r.CancelReason.JOB_CANCELED)
            for vertex in self._state.vertices.values():
                if vertex.definition.sink is not None:
                    continue
                for subtask in vertex.subtasks:
                    if subtask.winner is not None and subtask.available:
                        subtask.available = False
                        self.emit(
                            r.PartitionReleased,
                            partition=r.PartitionRef(
                                vertex.name, subtask.index, subtask.winner.number
                            ),
                        )
            plans.release_job(self.storage, self.job_id)
        except Exception:  # the job's end must be recorded even if the cleanup fails
            log.exception("cleaning up job %s", self.job_id)
        for host in self._pool.blocked():
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
        try:
            self.runtime.close()
        finally:
            self.publisher.close()

    def _update_progress(self) -> None:
        if not self.options.progress:
            return
        done, known = self._state.counts()
        if self._progress is None:
            from tqdm import tqdm

            self._progress = tqdm(total=known, desc=self.job.name, unit="task", leave=False)
        self._progress.total = known
        self._progress.n = done
        live = self._state.live_attempts()
        self._progress.set_postfix(
            running=len(live), speculative=sum(1 for a in live if a.speculative), refresh=False
        )
        self._progress.refresh()

    def _result(self) -> RunResult:
        summaries = []
        for vertex in self._state.vertices.values():
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
                            spilled_bytes=a.outcome.spilled_bytes if a.outcome is not None else 0,
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
                for v in self._state.vertices.values()
            },
            outputs={
                v.name: v.definition.sink.path
                for v in self._state.vertices.values()
                if v.definition.sink is not None
            },
            archive=getattr(self.publisher, "archive_path", None),
            blocked=tuple(self.blocks),
            commands_applied=self.commands_taken,
            commands_rejected=tuple(self.rejected),
            fallbacks=tuple(self.fallback_notes),
            events_published=self.events_published,
            chains={name: c.operators for name, c in self.graph.vertices.items()},
            dispatch_ms=tuple(self.dispatch_ms),
            deploy_to_running_ms=tuple(self.deploy_to_running_ms),
            runners_lost=self.runners_lost,
            recovery=self._recovery_summary(),
        )

    def _recovery_summary(self) -> RecoverySummary | None:
        rebuilt = self._recovered
        if rebuilt is None or self._recover_from is None:
            return None
        before = sum(1 for e in rebuilt.events if isinstance(e, r.AttemptDeploying))
        after = sum(len(s.attempts) for v in self._state.vertices.values() for s in v.subtasks)
        return RecoverySummary(
            source=self._recover_from.source,
            events_before=len(rebuilt.events),
            kept_results=rebuilt.kept_results,
            lost_attempts=len(rebuilt.lost_attempts),
            lost_results=len(rebuilt.lost_results),
            rerun_results=len(rebuilt.rerun_partitions),
            attempts_after=after - before,
        )
