"""Spark's own task events, translated into tailguard's records (pure: model and stdlib only).

The JVM listener (`java/tailguard/observe/TaskEventListener.java`) writes one tab-separated line
per Spark event; `SparkEventTranslator.handle` takes the fields of a line and returns the
tailguard events it means, `tick` the detector's clock. Both are pure functions of their inputs
(time comes from Spark's own timestamps or is passed in), so the records a relay published are
the records a test or a replay derives from the same lines.

The mapping:

- a Spark job (`SparkListenerJobStart`): a tailguard job `<application id>-job-<n>`, its
  stages as the graph;
- a stage: a vertex `stage-<id>`, parallelism fixed at the stage's task count
  (`decided_by="spark"`); its parent stages: ALL_TO_ALL edges (a shuffle);
- a task (its partition): a subtask; a task attempt (`TaskInfo`): an attempt, numbered per
  subtask in launch order, speculative as Spark says;
- an executor's host: a node;
- a task's end: `AttemptFinished` (success), `AttemptCanceled` (killed), `AttemptFailed`;
- a running task's reads so far, from its executor's heartbeat: `AttemptProgress` (bytes and
  records of input plus shuffle reads; the total it will read is unknown);
- a query stage's reads awaiting ranges (attach mode's query-stage rule, `PS` and `PE`): a job
  of its own for the decider (`observer/query_plans.py`).

Why a Spark job and not the application as the tailguard job: a tailguard job declares its whole
graph in `JobSubmitted`, and an application's stages are only known job by job (adaptive query
execution plans each query stage as a new Spark job). The detector then works unchanged, and its
per-job state ends with each Spark job as it does with a tailguard job.

Input bytes of a finished attempt are what Spark measured it read: its input (files, tables)
plus its shuffle reads. A live attempt's assigned bytes are not known in advance (Spark gives no
per-task split sizes before a task starts), so the detector compares plain execution times for
them, as FLIP-168 does when sizes are unknown.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from tailguard.model import records as r
from tailguard.model.ids import event_id
from tailguard.observer.query_plans import PlanRequest, parse_request, plan_job_events

__all__ = [
    "ObserveError",
    "RunningTask",
    "SparkEventTranslator",
    "is_plan_job",
    "observed_job_id",
    "stage_vertex",
]

# Spark's executor id for the driver: in local mode tasks run there, elsewhere it runs none.
DRIVER_EXECUTOR = "driver"
# How many ended jobs keep their event sequence (a command's outcome may come after the end).
ENDED_JOBS_KEPT = 16

E = TypeVar("E", bound=r.Event)


class ObserveError(ValueError):
    """A line the listener should never have written: names the line and the problem."""


def observed_job_id(app_id: str, spark_job: int) -> str:
    return f"{app_id}-job-{spark_job}"


_PLAN_JOB = "-job-plan-"


def plan_job_id(app_id: str, request: int) -> str:
    # Under the application's job prefix, so the relay reads the decisions about it.
    return f"{app_id}{_PLAN_JOB}{request}"


def is_plan_job(job_id: str) -> bool:
    """Whether `job_id` is a query stage's plan job (`plan_job_id`), not a Spark job."""
    return _PLAN_JOB in job_id


def stage_vertex(stage: int) -> str:
    return f"stage-{stage}"


@dataclass
class _Stage:
    stage: int
    tasks: int
    parents: tuple[int, ...]
    name: str


@dataclass
class _Job:
    job_id: str
    spark_job: int
    submitted_ts: int
    expected_stages: int
    stages: list[_Stage] = field(default_factory=list)
    submitted: bool = False
    sequence: int = 0
    last_tick: int = 0
    # (vertex, subtask) with a finished attempt: an attempt of one still running at the job's
    # end lost the race (Spark kills it after posting the job's end).
    done: set[tuple[str, int]] = field(default_factory=set)

    def next_id(self) -> str:
        self.sequence += 1
        return event_id(self.job_id, self.sequence)


@dataclass(frozen=True)
class _Task:
    job: _Job
    vertex: str
    subtask: int
    attempt: int
    host: str
    speculative: bool
    # Where Spark's scheduler knows it (attach mode acts on these): its task id, its stage's
    # attempt and its index in that attempt's task set, and when it was launched.
    task_id: int = -1
    stage: int = -1
    stage_attempt: int = 0
    index: int = -1
    launched_ts: int = 0


@dataclass(frozen=True)
class RunningTask:
    """A task attempt Spark is running now, as attach mode addresses it."""

    task_id: int
    stage: int
    stage_attempt: int
    index: int
    host: str
    launched_ts: int


class SparkEventTranslator:
    """Lines of the listener in, tailguard events out; one instance per Spark application."""

    def __init__(self, config: Mapping[str, str] | None = None) -> None:
        # The policy settings recorded in each JobSubmitted (the caller passes only what
        # `recorded_config` allows: never connection settings or secrets).
        self.config = dict(config or {})
        self.app_id = ""
        self.app_name = ""
        self._executors: dict[str, str] = {}
        self._hosts: dict[str, int] = {}  # host -> cores, in the order they appeared
        self._jobs: dict[int, _Job] = {}
        self._stage_job: dict[int, _Job] = {}
        self._stage_tasks: dict[int, int] = {}
        self._tasks: dict[int, _Task] = {}
        # Recently ended jobs, for outcomes of commands that arrive after the job's end.
        self._ended: dict[str, _Job] = {}
        self._attempts: dict[tuple[int, int], int] = {}
        # Query-stage plans awaiting ranges (attach mode's SetParallelism), by job id.
        self._plans: dict[str, tuple[PlanRequest, _Job]] = {}
        self.lines = 0
        self.ignored = 0

    # ------------------------------------------------------------------ public

    @property
    def running_jobs(self) -> list[str]:
        return [job.job_id for job in self._jobs.values() if job.submitted]

    def handle(self, fields: Sequence[str]) -> list[r.Event]:
        """The events one listener line means (often none: a line can only update state)."""
        if not fields:
            raise ObserveError("an empty line")
        kind = fields[0]
        handler = self._HANDLERS.get(kind)
        if handler is None:
            raise ObserveError(f"unknown line type {kind!r} in {list(fields)!r}")
        self.lines += 1
        try:
            return handler(self, fields[1:])
        except (IndexError, ValueError) as exc:
            raise ObserveError(f"malformed {kind} line {list(fields)!r}: {exc}") from exc

    @property
    def hosts(self) -> list[str]:
        """The application's hosts with executors, in the order they appeared."""
        return list(self._hosts)

    def running_job(self, job_id: str) -> int | None:
        """The Spark job number of tailguard job `job_id` while it runs, else None."""
        for job in self._jobs.values():
            if job.job_id == job_id and job.submitted:
                return job.spark_job
        return None

    def running_tasks(self, job_id: str, vertex: str, subtask: int) -> list[RunningTask]:
        """Spark's running attempts of one subtask, oldest first."""
        return sorted(
            (
                RunningTask(t.task_id, t.stage, t.stage_attempt, t.index, t.host, t.launched_ts)
                for t in self._tasks.values()
                if t.job.job_id == job_id and t.vertex == vertex and t.subtask == subtask
            ),
            key=lambda t: (t.launched_ts, t.task_id),
        )

    def subtask_problem(self, job_id: str, vertex: str, subtask: int) -> str | None:
        """Why `vertex#subtask` names no task of the running job `job_id`, or None."""
        spark_job = self.running_job(job_id)
        if spark_job is None:
            return f"job {job_id} is not running"
        job = self._jobs[spark_job]
        stage = next((s for s in job.stages if stage_vertex(s.stage) == vertex), None)
        if stage is None:
            return f"unknown vertex {vertex!r}"
        if self._stage_job.get(stage.stage) is not job:
            return f"stage {stage.stage} runs for another job"
        if not 0 <= subtask < max(1, stage.tasks):
            return f"unknown subtask {vertex}#{subtask} (parallelism {stage.tasks})"
        return None

    def plan_request(self, job_id: str) -> PlanRequest | None:
        """The query-stage plan job `job_id` while its rule waits for ranges, else None."""
        plan = self._plans.get(job_id)
        return plan[0] if plan is not None else None

    def job_event(self, job_id: str, kind: type[E], ts: int, **fields: Any) -> E | None:
        """An event of tailguard job `job_id` (running, or ended but still referenced by a
        pending outcome), numbered in its sequence; None if the job is unknown."""
        job = next((j for j in self._jobs.values() if j.job_id == job_id), None)
        plan = self._plans.get(job_id)
        job = job or (plan[1] if plan else None) or self._ended.get(job_id)
        if job is None:
            return None
        return kind(job_id=job_id, ts=ts, id=job.next_id(), **fields)

    def tick(self, now_ms: int) -> list[r.Event]:
        """A `Tick` for every running job at `now_ms` (never earlier than its last one)."""
        out: list[r.Event] = []
        for job in self._jobs.values():
            if not job.submitted:
                continue
            job.last_tick = max(job.last_tick, now_ms)
            out.append(r.Tick(job_id=job.job_id, ts=job.last_tick, id=job.next_id()))
        return out

    # ------------------------------------------------------------------ lines

    def _application(self, f: Sequence[str]) -> list[r.Event]:
        _, self.app_id, self.app_name = int(f[0]), f[1], f[2]
        if not self.app_id:
            raise ValueError("no application id")
        return []

    def _executor_added(self, f: Sequence[str]) -> list[r.Event]:
        ts, executor, host, cores = int(f[0]), f[1], f[2], int(f[3])
        self._executors[executor] = host
        if executor == DRIVER_EXECUTOR:
            return []  # a node only if tasks run there (local mode): added by its first task
        return self._add_host(ts, host, cores)

    def _executor_removed(self, f: Sequence[str]) -> list[r.Event]:
        ts, executor, reason = int(f[0]), f[1], f[2] if len(f) > 2 else ""
        host = self._executors.pop(executor, None)
        if host is None or host in self._executors.values() or host not in self._hosts:
            return []
        del self._hosts[host]
        return [
            r.NodeRemoved(job_id=j.job_id, ts=ts, id=j.next_id(), host=host, reason=reason)
            for j in self._jobs.values()
            if j.submitted
        ]

    def _job_started(self, f: Sequence[str]) -> list[r.Event]:
        ts, spark_job, stages = int(f[0]), int(f[1]), int(f[2])
        self._require_app()
        job = _Job(observed_job_id(self.app_id, spark_job), spark_job, ts, stages)
        self._jobs[spark_job] = job
        return self._submit(job) if stages == 0 else []

    def _job_stage(self, f: Sequence[str]) -> list[r.Event]:
        spark_job, stage, tasks = int(f[0]), int(f[1]), int(f[2])
        parents = tuple(int(p) for p in f[3].split(",") if p)
        job = self._jobs.get(spark_job)
        if job is None or job.submitted:
            raise ValueError(f"a stage of Spark job {spark_job}, which is not being declared")
        job.stages.append(_Stage(stage, tasks, parents, f[4] if len(f) > 4 else ""))
        return self._submit(job) if len(job.stages) == job.expected_stages else []

    def _job_ended(self, f: Sequence[str]) -> list[r.Event]:
        ts, spark_job, result = int(f[0]), int(f[1]), f[2]
        job = self._jobs.pop(spark_job, None)
        if job is None or not job.submitted:
            return []
        self._remember_ended(job)
        # Every attempt ends in the job's record: Spark posts the job's end before the ends of
        # the attempts it is still killing (a copy's loser, a task no longer needed).
        out: list[r.Event] = []
        for task_id, task in list(self._tasks.items()):
            if task.job is not job:
                continue
            del self._tasks[task_id]
            lost = (task.vertex, task.subtask) in job.done
            out.append(
                r.AttemptCanceled(
                    job_id=job.job_id,
                    ts=ts,
                    id=job.next_id(),
                    vertex=task.vertex,
                    subtask=task.subtask,
                    attempt=task.attempt,
                    host=task.host,
                    reason=r.CancelReason.LOST_RACE if lost else r.CancelReason.JOB_CANCELED,
                )
            )
        return [*out, self._finished(job, ts, result)]

    def _task_started(self, f: Sequence[str]) -> list[r.Event]:
        ts, task, stage, stage_attempt = int(f[0]), int(f[1]), int(f[2]), int(f[3])
        index, partition, executor, host = int(f[4]), int(f[5]), f[7], f[8]
        speculative = f[9] == "1"
        job = self._stage_job.get(stage)
        parallelism = self._stage_tasks.get(stage, 0)
        # The partition is the subtask; a job that computes only some partitions (take, first)
        # has fewer tasks than partitions, and there the task's index in its set is.
        subtask = partition if 0 <= partition < parallelism else index
        if job is None or not 0 <= subtask < parallelism:
            self.ignored += 1  # a stage of a job that started before the listener was attached
            return []
        self._executors.setdefault(executor, host)
        out = self._add_host(ts, host, 1) if host not in self._hosts else []
        attempt = self._attempts.get((stage, subtask), -1) + 1
        self._attempts[(stage, subtask)] = attempt
        vertex = stage_vertex(stage)
        self._tasks[task] = _Task(
            job, vertex, subtask, attempt, host, speculative, task, stage, stage_attempt, index, ts
        )
        out.append(
            r.AttemptDeploying(
                job_id=job.job_id,
                ts=ts,
                id=job.next_id(),
                vertex=vertex,
                subtask=subtask,
                attempt=attempt,
                host=host,
                speculative=speculative,
            )
        )
        return out

    def _task_ended(self, f: Sequence[str]) -> list[r.Event]:
        ts, task_id, reason = int(f[0]), int(f[1]), f[4]
        task = self._tasks.pop(task_id, None)
        if task is None:
            # Not started under observation, or Spark's "Resubmitted" for a task that had
            # finished (its output was lost; the new attempt starts as a new task).
            self.ignored += 1
            return []
        job = task.job
        common: dict[str, Any] = {
            "job_id": job.job_id,
            "ts": ts,
            "id": job.next_id(),
            "vertex": task.vertex,
            "subtask": task.subtask,
            "attempt": task.attempt,
            "host": task.host,
        }
        if reason == "Success":
            job.done.add((task.vertex, task.subtask))
            read = [int(x) for x in (f[5], f[7]) if int(x) >= 0]
            records = sum(max(0, int(x)) for x in (f[6], f[8]))
            return [
                r.AttemptFinished(
                    **common,
                    input_bytes=sum(read) if read else None,
                    records=records,
                    bytes_per_subpartition=(),
                    checksums=(),
                )
            ]
        message = f[9] if len(f) > 9 else reason
        if reason == "TaskKilled":
            lost_race = "another attempt succeeded" in message
            cancel = r.CancelReason.LOST_RACE if lost_race else r.CancelReason.JOB_CANCELED
            return [r.AttemptCanceled(**common, reason=cancel)]
        return [
            r.AttemptFailed(
                **common,
                error=_ERROR_KINDS.get(reason, r.ErrorKind.INFRA),
                message=message or reason,
            )
        ]

    def _task_progress(self, f: Sequence[str]) -> list[r.Event]:
        ts, task_id = int(f[0]), int(f[1])
        task = self._tasks.get(task_id)
        if task is None:
            return []  # ended since the heartbeat, or not started under observation
        read = [int(x) for x in (f[2], f[4]) if int(x) >= 0]
        return [
            r.AttemptProgress(
                job_id=task.job.job_id,
                ts=ts,
                id=task.job.next_id(),
                vertex=task.vertex,
                subtask=task.subtask,
                attempt=task.attempt,
                host=task.host,
                records_read=sum(max(0, int(x)) for x in (f[3], f[5])),
                bytes_read=sum(read),
                # Spark does not say how much a running task will read.
                bytes_total=None,
            )
        ]

    def _plan_requested(self, f: Sequence[str]) -> list[r.Event]:
        self._require_app()
        plan = parse_request(f, lambda n: plan_job_id(self.app_id, n))
        if plan.job_id in self._plans or plan.job_id in self._ended:
            raise ValueError(f"query-stage plan {plan.request} requested twice")
        job = _Job(plan.job_id, -1, plan.ts, 0, submitted=True)
        self._plans[plan.job_id] = (plan, job)
        name = f"{self.app_name} (query-stage plan {plan.request})"
        return plan_job_events(plan, name, self.config, job.next_id)

    def _plan_ended(self, f: Sequence[str]) -> list[r.Event]:
        ts, request, outcome = int(f[0]), int(f[1]), f[2]
        plan = self._plans.pop(plan_job_id(self.app_id, request), None)
        if plan is None:
            raise ValueError(f"the end of query-stage plan {request}, which was not requested")
        job = plan[1]
        self._remember_ended(job)
        if outcome == "applied":
            return [self._finished(job, ts, "SUCCEEDED")]
        # Spark plans the stage with its own ranges: the job did not do what it was for.
        return [self._finished(job, ts, "CANCELED", f"Spark's ranges kept: {outcome}")]

    def _application_ended(self, f: Sequence[str]) -> list[r.Event]:
        ts = int(f[0])
        out: list[r.Event] = [
            self._finished(job, ts, "CANCELED", "the application ended before the job")
            for job in self._jobs.values()
            if job.submitted
        ]
        self._jobs.clear()
        for _, job in self._plans.values():
            out.append(self._finished(job, ts, "CANCELED", "the application ended first"))
        self._plans.clear()
        return out

    _HANDLERS: ClassVar[
        dict[str, Callable[[SparkEventTranslator, Sequence[str]], list[r.Event]]]
    ] = {
        "A": _application,
        "X": _executor_added,
        "XR": _executor_removed,
        "J": _job_started,
        "G": _job_stage,
        "JE": _job_ended,
        "TS": _task_started,
        "TE": _task_ended,
        "TP": _task_progress,
        "PS": _plan_requested,
        "PE": _plan_ended,
        "E": _application_ended,
    }

    # ------------------------------------------------------------------ helpers

    def _remember_ended(self, job: _Job) -> None:
        self._ended[job.job_id] = job
        while len(self._ended) > ENDED_JOBS_KEPT:
            del self._ended[next(iter(self._ended))]

    def _require_app(self) -> None:
        if not self.app_id:
            raise ValueError("a job before the application line (A)")

    def _add_host(self, ts: int, host: str, cores: int) -> list[r.Event]:
        if host in self._hosts:
            return []
        self._hosts[host] = cores
        return [
            r.NodeAdded(job_id=j.job_id, ts=ts, id=j.next_id(), host=host, slots=cores)
            for j in self._jobs.values()
            if j.submitted
        ]

    def _submit(self, job: _Job) -> list[r.Event]:
        job.submitted = True
        job.last_tick = job.submitted_ts
        in_job = {s.stage for s in job.stages}
        vertices: list[r.VertexSpec] = []
        edges: list[r.EdgeSpec] = []
        for s in sorted(job.stages, key=lambda s: s.stage):
            parents = [p for p in s.parents if p in in_job]
            vertices.append(
                r.VertexSpec(
                    name=stage_vertex(s.stage),
                    kind=r.VertexKind.OPERATOR if parents else r.VertexKind.SOURCE,
                    # Fixed: Spark decided it, and the decider must not try to.
                    parallelism=max(1, s.tasks),
                    operators=(s.name,) if s.name else (),
                )
            )
            edges.extend(
                r.EdgeSpec(
                    stage_vertex(p), stage_vertex(s.stage), r.Distribution.ALL_TO_ALL, index=i
                )
                for i, p in enumerate(parents)
            )
            # A stage shared with a running job keeps running for the job that started it.
            self._stage_job.setdefault(s.stage, job)
            self._stage_tasks[s.stage] = max(1, s.tasks)
        ts = job.submitted_ts
        out: list[r.Event] = [
            r.JobSubmitted(
                job_id=job.job_id,
                ts=ts,
                id=job.next_id(),
                name=f"{self.app_name} (Spark job {job.spark_job})",
                graph=r.JobGraphSpec(tuple(vertices), tuple(edges)),
                config=dict(self.config),
            )
        ]
        out.extend(
            r.NodeAdded(job_id=job.job_id, ts=ts, id=job.next_id(), host=h, slots=c)
            for h, c in self._hosts.items()
        )
        out.extend(
            r.VertexInitialized(
                job_id=job.job_id,
                ts=ts,
                id=job.next_id(),
                vertex=v.name,
                parallelism=v.parallelism or 1,
                subtask_inputs=(),
                decided_by="spark",
            )
            for v in vertices
        )
        return out

    def _finished(self, job: _Job, ts: int, result: str, message: str = "") -> r.JobFinished:
        stages = {s for s, j in self._stage_job.items() if j is job}
        for stage in stages:
            del self._stage_job[stage]
        # Attempt numbers only matter while a stage can run; kept longer, a long application's
        # translator would grow with every task it ever ran.
        for key in [k for k in self._attempts if k[0] in stages]:
            del self._attempts[key]
        for task_id in [t for t, task in self._tasks.items() if task.job is job]:
            del self._tasks[task_id]
        status = r.JobStatus(result) if result in r.JobStatus.__members__ else r.JobStatus.FAILED
        return r.JobFinished(
            job_id=job.job_id, ts=ts, id=job.next_id(), status=status, message=message
        )


# Spark's TaskEndReason classes -> tailguard's error kinds. A fetch failure is a lost shuffle
# output, but Spark names no tailguard partition for it, so it stays INFRA: the failover
# service must not backtrack to a producer it cannot identify.
_ERROR_KINDS = {
    "ExceptionFailure": r.ErrorKind.USER,
    "ExecutorLostFailure": r.ErrorKind.NODE_LOST,
    "TaskResultLost": r.ErrorKind.INFRA,
    "FetchFailed": r.ErrorKind.INFRA,
    "TaskCommitDenied": r.ErrorKind.INFRA,
}
