"""The agent's driver loop: turns the chained job graph into attempts deployed to slot runners,
facts into events, and commands into changes.

One thread owns all state. Runner connections, Spark's runner jobs, the command consumer and the
storage thread only post typed messages to its inbox, so every decision the agent takes happens
in one order, which is the order of the events it publishes. `JobDriver` puts the job's roles
together and runs that thread: its loop only takes messages and hands each to its role.

The roles, a file each: `events` (sequencing), `lifecycle` (start, runners awaited, end),
`takeover` (recovery), `runners` (runner messages), `initialization` (vertices), `scheduling`
(placement and deployment), `outcomes` (attempt ends, sink commits), `applier` and `actions`
(commands), `report` (progress and the result), `storage_io` (I/O off this thread).
"""

from __future__ import annotations

import logging
import queue
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from tailguard.agent.driver import recovery
from tailguard.agent.driver.actions import Actions
from tailguard.agent.driver.applier import CommandApplier
from tailguard.agent.driver.context import JobContext
from tailguard.agent.driver.events import EventLog
from tailguard.agent.driver.fallbacks import LocalFallbacks
from tailguard.agent.driver.hooks import JobHooks
from tailguard.agent.driver.initialization import VertexInitializer
from tailguard.agent.driver.lifecycle import Lifecycle
from tailguard.agent.driver.local_aggregation import strategy_of as agg_phase_strategy
from tailguard.agent.driver.options import RunOptions
from tailguard.agent.driver.outcomes import Outcomes
from tailguard.agent.driver.ports import (
    AgentThreadFailed,
    CommandReceived,
    FromRunner,
    InboxMessage,
    Publisher,
    RunnerConnected,
    RunnerLost,
    Runtime,
    StorageDone,
)
from tailguard.agent.driver.report import (
    Progress,
    attempt_summaries,
    outputs,
    parallelism,
    recovery_summary,
)
from tailguard.agent.driver.result import RunResult
from tailguard.agent.driver.runners import Runners
from tailguard.agent.driver.scheduling import Scheduler
from tailguard.agent.driver.slots import SlotPool
from tailguard.agent.driver.state import ExecutionState
from tailguard.agent.driver.storage_io import StorageWorker
from tailguard.agent.executor.environment import ExecutorEnvironmentError
from tailguard.agent.graph.api import Job
from tailguard.agent.graph.chaining import chain
from tailguard.decider.policy.broadcast_join import BroadcastJoinParams
from tailguard.model import records as r
from tailguard.model.config import Settings

__all__ = ["JobDriver", "RunOptions", "new_job_id"]

log = logging.getLogger("tailguard.agent")


def new_job_id(job: Job) -> str:
    return f"{job.name}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


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
        hooks: JobHooks | None = None,
    ) -> None:
        """`recover`: the log of this job's dead driver; the job is taken over from where it
        stopped (`agent/driver/takeover.py`) instead of started. `hooks`: a test's (`hooks.py`)."""
        self.job = job
        self.job_id = job_id or new_job_id(job)
        if recover is not None and recover.job_id != self.job_id:
            raise recovery.RecoveryError(
                f"the log given is job {recover.job_id}'s, not {self.job_id}'s"
            )
        assert options.storage is not None, "RunOptions.storage is required"
        self.inbox: queue.Queue[InboxMessage] = inbox if inbox is not None else queue.Queue()
        self.publisher = publisher
        self.settings = settings
        self.options = options
        self.hooks = hooks = hooks or JobHooks()
        fallbacks = LocalFallbacks(settings, options.services)
        graph = chain(job)
        self._ctx = ctx = JobContext(
            job_id=self.job_id,
            job=job,
            graph=graph,
            settings=settings,
            options=options,
            hooks=hooks,
            runtime=runtime,
            storage=options.storage,
            state=ExecutionState(
                graph,
                settings.integer("execution.batch.adaptive.auto-parallelism.max-parallelism"),
                BroadcastJoinParams.from_settings(settings),
                agg_phase_strategy(settings),
            ),
            pool=SlotPool(),
            events=EventLog(self.job_id, publisher, fallbacks, hooks.on_event),
            io=StorageWorker(self.post),
        )
        self.check_interval = settings.duration_ms("slow-task-detector.check-interval")
        self._outcomes = Outcomes(ctx)
        self._runners = Runners(ctx, self._outcomes)
        self._initializer = VertexInitializer(ctx)
        self._scheduler = Scheduler(ctx, self._runners)
        self._actions = Actions(ctx, self._initializer, self._outcomes, self._end)
        self._applier = CommandApplier(ctx, self._actions, fallbacks)
        self._lifecycle = Lifecycle(
            ctx, self._applier, self._actions, self._outcomes, self._runners, recover
        )
        self._progress = Progress(job.name, options.progress)
        # What tests and the job's hooks read of it (owned by the driver's thread).
        self.graph = graph
        self.runtime = runtime
        self.storage = ctx.storage
        self.state = ctx.state
        self.pool = ctx.pool
        self.rejected = self._applier.rejected
        self.deploy_to_running_ms = self._runners.deploy_to_running_ms
        self._handlers: Mapping[type, Callable[[Any], None]] = {
            RunnerConnected: self._runners.on_connected,
            RunnerLost: self._runners.on_lost,
            FromRunner: self._runners.on_report,
            CommandReceived: self._applier.on_command,
            AgentThreadFailed: _thread_failed,
            StorageDone: ctx.io.complete,
        }

    # ================================================================ what others see

    @property
    def status(self) -> r.JobStatus | None:
        return self._ctx.status

    @property
    def message(self) -> str:
        return self._lifecycle.message

    @property
    def storage_busy(self) -> bool:
        """Storage work handed off whose continuation has not run yet (tests wait on it)."""
        return self._ctx.io.busy

    def post(self, message: InboxMessage) -> None:
        """Thread-safe entry for other threads (runner connections, the command consumer)."""
        self.inbox.put(message)

    # ================================================================ the thread

    def run(self) -> RunResult:
        self._lifecycle.started_ms = self._ctx.now()
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
            self._progress.close()
            self._lifecycle.close()
        return self._result()

    def _start(self) -> None:
        self._lifecycle.submit()
        launched = self._ctx.runtime.start(self.job_id, self.post)
        self._lifecycle.await_runners(launched, self.inbox, self._dispatch)
        self._lifecycle.before_placing()
        if self.hooks.on_start is not None:
            self.hooks.on_start(self)
        self._initializer.initialize_static()

    def _loop(self) -> None:
        ctx = self._ctx
        next_tick = ctx.now() + self.check_interval
        while ctx.status is None:
            self._applier.apply_due_fallbacks()
            self._scheduler.schedule()
            if ctx.state.all_done():
                self._lifecycle.succeed()
                break
            now = ctx.now()
            if now >= next_tick:
                self._tick()
                next_tick = now + self.check_interval
                continue
            wake = next_tick
            deadline = self._applier.fallbacks.next_deadline()
            if deadline is not None:
                wake = min(wake, max(deadline, now))
            try:
                message = self.inbox.get(timeout=max(0.0, (wake - now) / 1000.0))
            except queue.Empty:
                continue
            self._dispatch(message)
            # Drain what else arrived without waiting, before scheduling again.
            while ctx.status is None:
                try:
                    message = self.inbox.get_nowait()
                except queue.Empty:
                    break
                self._dispatch(message)

    def _dispatch(self, message: InboxMessage) -> None:
        self._handlers[type(message)](message)

    def _tick(self) -> None:
        self._ctx.events.emit(r.Tick)
        self._ctx.runtime.ensure_runners()
        self._actions.lift_expired()
        self._progress.update(self._ctx.state)

    def _end(self, status: r.JobStatus, message: str) -> None:
        self._lifecycle.end(status, message)

    def _result(self) -> RunResult:
        ctx, lifecycle, applier = self._ctx, self._lifecycle, self._applier
        now = ctx.now()
        return RunResult(
            job_id=self.job_id,
            status=(ctx.status or r.JobStatus.FAILED).value,
            message=lifecycle.message,
            started_ms=lifecycle.started_ms,
            finished_ms=lifecycle.finished_ms or now,
            attempts=attempt_summaries(ctx.state, now),
            parallelism=parallelism(ctx.state),
            outputs=outputs(ctx.state),
            archive=getattr(self.publisher, "archive_path", None),
            blocked=tuple(self._actions.blocks),
            commands_applied=applier.taken,
            commands_rejected=tuple(applier.rejected),
            fallbacks=tuple(applier.fallback_notes),
            events_published=ctx.events.published,
            chains={name: c.operators for name, c in ctx.graph.vertices.items()},
            local_aggregation={
                producer: phase.operator
                for producer, phase in ctx.state.local_aggregation.phases.items()
            },
            fused=dict(ctx.state.broadcast_joins.fused),
            dispatch_ms=tuple(self._runners.dispatch_ms),
            deploy_to_running_ms=tuple(self._runners.deploy_to_running_ms),
            runners_lost=self._runners.lost,
            recovery=recovery_summary(ctx.state, lifecycle.recover_from, lifecycle.recovered),
        )


def _thread_failed(message: AgentThreadFailed) -> None:
    # Raised here, on the driver's thread: `run` fails the job with it (JobFinished FAILED).
    raise RuntimeError(f"agent thread {message.thread} died: {message.error!r}") from message.error
