"""tailguard's commands as actions on a running Spark application (pure: model and policy only).

Each command type has a guard, dispatched through a table as the owned driver's are
(`agent/driver/commands.py`): it checks the command against the application as the relay sees
it (`AppView`: Spark's running tasks, the hosts, the blocks in force) and returns either the
reason a person can act on, or the `SparkAction` the JVM actuator applies. Spark's scheduler has
the last word under its own lock (a task can finish between the guard and the action): the
actuator answers each action with OK or its own reason.

What each command means inside Spark (docs/attach.md):
- `LaunchSpeculativeAttempts`: one speculative copy of the task, as Spark's own speculation
  starts it. Spark runs a copy only while exactly one attempt runs and never on a host where the
  task already ran, so a count above one, or a task already copied, is refused here.
- `BlockNodes` / `UnblockNodes`: the application's exclusion list (Spark's HealthTracker), so
  every job of the application keeps off the host until `until_ts`.
- `RestartTasks`: the attempts of the named subtasks that started before the decision are
  killed, and Spark re-runs them (a kill is not a failure). An attempt that started since is
  already the re-run (Spark retries a failed task by itself), and is left alone.
- `FailJob`: the Spark job is cancelled with the reason.
- `SetParallelism`: only for a query stage the attach jar's query-stage rule is planning (the
  SQL extension; `observer/query_plans.py`): its reducer ranges, which the rule waits for. A
  stage Spark has planned keeps its task count.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tailguard.model import records as r
from tailguard.model.blocking import blocked_fraction_problem
from tailguard.model.fleet import FLEET_SETTING, is_fleet_cause
from tailguard.observer.query_plans import PlanRequest, plan_ends
from tailguard.observer.translate import RunningTask

__all__ = [
    "AppView",
    "CancelJob",
    "Coalesce",
    "Exclude",
    "Include",
    "Kill",
    "NoAction",
    "RunningTask",
    "SparkAction",
    "Speculate",
    "action_for",
    "action_line",
]


class AppView(Protocol):
    """What a guard may read of the attached application."""

    @property
    def hosts(self) -> Collection[str]: ...

    @property
    def blocked(self) -> Collection[str]: ...

    @property
    def max_blocked_fraction(self) -> float: ...

    @property
    def fleet_enabled(self) -> bool: ...

    def running_job(self, job_id: str) -> int | None: ...

    def subtask_problem(self, job_id: str, vertex: str, subtask: int) -> str | None: ...

    def running_tasks(self, job_id: str, vertex: str, subtask: int) -> Sequence[RunningTask]: ...

    def plan_request(self, job_id: str) -> PlanRequest | None: ...


@dataclass(frozen=True)
class Speculate:
    stage: int
    stage_attempt: int
    index: int


@dataclass(frozen=True)
class Exclude:
    hosts: tuple[str, ...]
    until_ts: int
    cause: str


@dataclass(frozen=True)
class Include:
    hosts: tuple[str, ...]


@dataclass(frozen=True)
class Kill:
    task_ids: tuple[int, ...]
    reason: str


@dataclass(frozen=True)
class CancelJob:
    spark_job: int
    reason: str


@dataclass(frozen=True)
class Coalesce:
    """The reducer ranges a waiting query stage reads: subtask k reads partitions
    `ends[k-1]` (0 for the first) up to `ends[k]`, exclusive."""

    request: int
    ends: tuple[int, ...]


@dataclass(frozen=True)
class NoAction:
    """Applied with nothing for Spark to do (`why` says so in the relay's log)."""

    why: str


SparkAction = Speculate | Exclude | Include | Kill | CancelJob | Coalesce | NoAction


def _clean(text: str) -> str:
    # Free text travels in a tab-separated line.
    return text.replace("\t", " ").replace("\n", " ").replace("\r", " ")


def action_line(command_id: str, action: SparkAction) -> str:
    """The line the JVM actuator reads (`Actuator.handle`); not for `NoAction`."""
    if isinstance(action, Speculate):
        fields: tuple[Any, ...] = ("SPEC", action.stage, action.stage_attempt, action.index)
    elif isinstance(action, Exclude):
        fields = ("BLOCK", action.until_ts, ",".join(action.hosts))
    elif isinstance(action, Include):
        fields = ("UNBLOCK", ",".join(action.hosts))
    elif isinstance(action, Kill):
        fields = ("KILL", _clean(action.reason), ",".join(str(t) for t in action.task_ids))
    elif isinstance(action, CancelJob):
        fields = ("CANCEL", action.spark_job, _clean(action.reason))
    elif isinstance(action, Coalesce):
        fields = ("RANGES", action.request, ",".join(str(e) for e in action.ends))
    else:
        raise ValueError(f"{action!r} has no line: nothing for Spark to do")
    head, *rest = fields
    return "\t".join([head, _clean(command_id), *(str(x) for x in rest)]) + "\n"


# --------------------------------------------------------------------------- guards


def _speculate(c: r.LaunchSpeculativeAttempts, app: AppView) -> SparkAction | str:
    problem = app.subtask_problem(c.job_id, c.vertex, c.subtask)
    if problem:
        return problem
    if c.count != 1:
        return (
            f"count {c.count}: Spark runs at most one copy of a task beside the original, "
            f"and only while exactly one attempt runs"
        )
    running = app.running_tasks(c.job_id, c.vertex, c.subtask)
    if not running:
        return f"subtask {c.vertex}#{c.subtask} has no running attempt to copy"
    if len(running) > 1:
        return f"subtask {c.vertex}#{c.subtask} already has {len(running)} attempts running"
    task = running[0]
    others = set(app.hosts) - set(app.blocked) - {task.host}
    if not others:
        return f"no host but {task.host} can run a copy of {c.vertex}#{c.subtask}"
    return Speculate(task.stage, task.stage_attempt, task.index)


def _block(c: r.BlockNodes, app: AppView) -> SparkAction | str:
    if not c.hosts:
        return "no hosts to block"
    unknown = [h for h in c.hosts if h not in app.hosts]
    if unknown:
        return f"unknown host(s) {unknown}"
    if c.until_ts <= c.ts:
        return f"until_ts {c.until_ts} is not after the command's ts {c.ts}"
    if is_fleet_cause(c.cause) and not app.fleet_enabled:
        return f"application opted out of the fleet blocklist ({FLEET_SETTING} = false)"
    usable = set(app.hosts) - set(app.blocked) - set(c.hosts)
    if not usable:
        return f"blocking {sorted(c.hosts)} would block the last usable hosts"
    problem = blocked_fraction_problem(app.blocked, c.hosts, app.hosts, app.max_blocked_fraction)
    if problem:
        return problem
    return Exclude(tuple(c.hosts), c.until_ts, c.cause)


def _unblock(c: r.UnblockNodes, app: AppView) -> SparkAction | str:
    unknown = [h for h in c.hosts if h not in app.hosts and h not in app.blocked]
    if unknown:
        return f"unknown host(s) {unknown}"
    held = tuple(h for h in c.hosts if h in app.blocked)
    return Include(held) if held else NoAction(f"{list(c.hosts)} not blocked")


def _restart(c: r.RestartTasks, app: AppView) -> SparkAction | str:
    if not c.tasks:
        return "no tasks to restart"
    victims: list[int] = []
    for task in c.tasks:
        problem = app.subtask_problem(c.job_id, task.vertex, task.subtask)
        if problem:
            return problem
        # Started before the decision: the attempt it is about. Started since: Spark's own
        # retry of a failed attempt, which is already the restart.
        victims += [
            t.task_id
            for t in app.running_tasks(c.job_id, task.vertex, task.subtask)
            if t.launched_ts < c.ts
        ]
    if not victims:
        return NoAction("no attempt from before the decision runs: Spark re-runs failed tasks")
    return Kill(tuple(victims), f"tailguard RestartTasks {c.id}: {c.reason}")


def _fail(c: r.FailJob, app: AppView) -> SparkAction | str:
    spark_job = app.running_job(c.job_id)
    if spark_job is None:
        return f"job {c.job_id} is not running"
    return CancelJob(spark_job, f"tailguard FailJob {c.id}: {c.reason}")


def _set_parallelism(c: r.SetParallelism, app: AppView) -> SparkAction | str:
    plan = app.plan_request(c.job_id)
    if plan is None:
        return (
            f"no query stage waits for job {c.job_id}'s ranges: a stage Spark has planned keeps "
            f"its task count (a query stage's plan waits tailguard.attach.decision-timeout, "
            f"then keeps Spark's ranges)"
        )
    ends = plan_ends(c, plan)
    return ends if isinstance(ends, str) else Coalesce(plan.request, ends)


GUARDS: Mapping[type[r.Command], Callable[[Any, AppView], SparkAction | str]] = {
    r.LaunchSpeculativeAttempts: _speculate,
    r.BlockNodes: _block,
    r.UnblockNodes: _unblock,
    r.RestartTasks: _restart,
    r.FailJob: _fail,
    r.SetParallelism: _set_parallelism,
}


def action_for(command: r.Command, app: AppView) -> SparkAction | str:
    """The action that applies `command` to the application, or the reason to reject it."""
    guard = GUARDS.get(type(command))
    if guard is None:
        return f"unknown command type {type(command).__name__}"
    return guard(command, app)
