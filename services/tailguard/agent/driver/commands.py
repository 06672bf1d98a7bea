"""Commands, dispatched through a table from command type to handler.

Each handler is a guard (is the command valid against the job as it is now? If not, the reason a
person can act on) and an apply (the change, with the events it emits), written against two
narrow views of the driver: `JobView` to read, `JobActions` to act. A rejected command is answered
with `CommandRejected` and the job goes on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from tailguard.agent.driver.slots import ExecutionVertexId, SlotPool, SpeculativeRequest
from tailguard.agent.driver.state import ExecutionState
from tailguard.model import records as r
from tailguard.model.blocking import blocked_fraction_problem
from tailguard.model.config import Settings
from tailguard.model.fleet import FLEET_SETTING, is_fleet_cause
from tailguard.model.records import SPLITS_INPUT


class JobView(Protocol):
    """What a guard may read."""

    @property
    def state(self) -> ExecutionState: ...

    @property
    def pool(self) -> SlotPool: ...

    @property
    def hosts(self) -> frozenset[str]:
        """The job's hosts: those with runners in the pool, and those Spark has a live executor
        on whose runners have not connected yet (a command may name them; a block holds when
        they join)."""

    @property
    def split_counts(self) -> Mapping[str, int]: ...

    @property
    def max_concurrent(self) -> int: ...

    @property
    def max_blocked_fraction(self) -> float: ...

    @property
    def settings(self) -> Settings: ...


class JobActions(JobView, Protocol):
    """What an apply may do (the driver implements it; each action emits its own events)."""

    def initialize_vertex(
        self,
        name: str,
        parallelism: int,
        inputs: tuple[r.SubtaskInputs, ...],
        by: str,
        command_id: str,
    ) -> None: ...

    def request_speculative(
        self, task: ExecutionVertexId, command_id: str, count: int, avoid: frozenset[str]
    ) -> None: ...

    def block_host(self, host: str, until_ts: int, cause: str, command_id: str) -> None: ...

    def unblock_host(self, host: str, command_id: str | None) -> None: ...

    def restart_task(self, task: ExecutionVertexId, not_before_ts: int) -> None: ...

    def fail_job(self, reason: str) -> None: ...


C = TypeVar("C", bound=r.Command)


@dataclass(frozen=True)
class Handler(Generic[C]):
    guard: Callable[[C, JobView], str | None]
    # `fallback`: the agent decided this itself (for `decided_by`).
    apply: Callable[[C, JobActions, bool], None]


# --------------------------------------------------------------------------- shared checks


def _vertex_problem(view: JobView, name: str) -> str | None:
    if name not in view.state.vertices:
        return f"unknown vertex {name!r}"
    return None


def _subtask_problem(view: JobView, vertex: str, index: int) -> str | None:
    problem = _vertex_problem(view, vertex)
    if problem:
        return problem
    v = view.state.vertices[vertex]
    if not v.initialized:
        return f"vertex {vertex!r} is not initialised yet"
    if not 0 <= index < len(v.subtasks):
        return f"unknown subtask {vertex}#{index} (parallelism {v.parallelism})"
    return None


def _range_problem(view: JobView, vertex: str, rng: r.InputRange) -> str | None:
    if rng.input == SPLITS_INPUT:
        count = view.split_counts.get(vertex, 0)
        if not 0 <= rng.partition_start <= rng.partition_end < count:
            return f"split range {rng.partition_start}..{rng.partition_end} outside 0..{count - 1}"
        return None
    producer = view.state.vertices[rng.input]
    if not producer.initialized:
        return None  # reported once, by the caller
    assert producer.parallelism is not None
    if not 0 <= rng.partition_start <= rng.partition_end < producer.parallelism:
        return (
            f"{rng.input}: partition range {rng.partition_start}..{rng.partition_end} "
            f"outside 0..{producer.parallelism - 1}"
        )
    if not 0 <= rng.subpartition_start <= rng.subpartition_end < producer.subpartitions:
        return (
            f"{rng.input}: subpartition range {rng.subpartition_start}.."
            f"{rng.subpartition_end} outside 0..{producer.subpartitions - 1}"
        )
    return None


# --------------------------------------------------------------------------- SetParallelism


def _guard_set_parallelism(c: r.SetParallelism, view: JobView) -> str | None:
    state = view.state
    problem = _vertex_problem(view, c.vertex)
    if problem:
        return problem
    vertex = state.vertices[c.vertex]
    if vertex.initialized:
        return f"vertex {c.vertex!r} is already initialised with parallelism {vertex.parallelism}"
    fixed = vertex.definition.parallelism
    if fixed is not None and c.parallelism != fixed:
        return f"vertex {c.vertex!r} has a fixed parallelism of {fixed}"
    # Not min-parallelism: the data may cap a vertex below it (a source with fewer splits, a
    # producer with fewer subpartitions), and no subtask may be given an empty range.
    high = state.max_parallelism(c.vertex)
    if not 1 <= c.parallelism <= high:
        return f"parallelism {c.parallelism} outside bounds [1, {high}]"
    if sorted(s.subtask for s in c.subtask_inputs) != list(range(c.parallelism)):
        return "subtask_inputs must name each subtask 0..parallelism-1 exactly once"
    if c.broadcast is not None:
        join = state.broadcast_joins.joins.get(c.vertex)
        if join is None:
            return f"vertex {c.vertex!r} is not a join the agent can turn into a broadcast join"
        if c.broadcast.input not in join.producers:
            return f"{c.broadcast.input!r} is not an input of join {c.vertex!r}"
    expected = {i.producer for i in vertex.definition.inputs}
    if vertex.definition.source is not None:
        expected = {SPLITS_INPUT}
    for producer in expected - {SPLITS_INPUT}:
        if not state.vertices[producer].initialized:
            return f"input {producer!r} is not initialised yet"
    pointwise = {
        i.producer for i in vertex.definition.inputs if i.distribution is r.Distribution.POINTWISE
    }
    split = {x.input for x in c.skew_splits}
    for s in c.subtask_inputs:
        names = [i.input for i in s.inputs]
        if sorted(set(names)) != sorted(expected):
            return f"subtask {s.subtask}: inputs {sorted(set(names))} != {sorted(expected)}"
        # A POINTWISE input may be read as a run of several ranges, and a join input whose
        # skewed subpartition the decider split (a partition range of it beside whole
        # subpartitions); any other as one.
        repeated = sorted({n for n in names if names.count(n) > 1} - pointwise - split)
        if repeated:
            return f"subtask {s.subtask}: several ranges of non-POINTWISE input(s) {repeated}"
        overlap = _overlapping([i for i in s.inputs if names.count(i.input) > 1])
        if overlap:
            return f"subtask {s.subtask}: reads {overlap} twice"
        for rng in s.inputs:
            problem = _range_problem(view, c.vertex, rng)
            if problem:
                return f"subtask {s.subtask}: {problem}"
    return None


def _overlapping(ranges: Sequence[r.InputRange]) -> str | None:
    """A (input, partition, subpartition) two of `ranges` both cover, if any: two ranges of one
    input overlap when their partition and their subpartition intervals both intersect (pairs,
    not cells: a split input's ranges span every producer partition)."""
    for i, a in enumerate(ranges):
        for b in ranges[i + 1 :]:
            if (
                a.input == b.input
                and a.partition_start <= b.partition_end
                and b.partition_start <= a.partition_end
                and a.subpartition_start <= b.subpartition_end
                and b.subpartition_start <= a.subpartition_end
            ):
                p = max(a.partition_start, b.partition_start)
                sp = max(a.subpartition_start, b.subpartition_start)
                return f"{a.input} partition {p} subpartition {sp}"
    return None


def _apply_set_parallelism(c: r.SetParallelism, job: JobActions, fallback: bool) -> None:
    by = "agent-fallback" if fallback else "decider"
    inputs = c.subtask_inputs
    if c.broadcast is not None:
        # The other side is read in whole partitions, however it was (or will be) written.
        inputs = job.state.broadcast_join(c.vertex, c.broadcast.input, inputs)
    job.initialize_vertex(c.vertex, c.parallelism, inputs, by, c.id)


# --------------------------------------------------------------------------- speculation


def _guard_speculate(c: r.LaunchSpeculativeAttempts, view: JobView) -> str | None:
    problem = _subtask_problem(view, c.vertex, c.subtask)
    if problem:
        return problem
    if c.count < 1:
        return f"count must be at least 1, got {c.count}"
    vertex = view.state.vertices[c.vertex]
    if not vertex.definition.speculation_safe:
        return f"vertex {c.vertex!r} is declared unsafe for speculation"
    subtask = vertex.subtasks[c.subtask]
    if subtask.winner is not None:
        return f"subtask {c.vertex}#{c.subtask} already finished"
    region = view.state.region_of(c.vertex, c.subtask)
    if region is not None:
        # Its pipelined partners read (or feed) one specific attempt, deployed with them.
        return (
            f"subtask {c.vertex}#{c.subtask} is in a pipelined region of {len(region)} tasks; "
            f"speculation needs a blocking input and output"
        )
    live = len(subtask.live_attempts())
    if live == 0:
        return f"subtask {c.vertex}#{c.subtask} has no running attempt to mirror"
    task = ExecutionVertexId(c.vertex, c.subtask)
    queued = sum(
        1
        for req in view.pool.pending()
        if isinstance(req.key, SpeculativeRequest) and req.key.task == task
    )
    limit = view.max_concurrent
    if live + queued + c.count > limit:
        return (
            f"{live} running + {queued} queued + {c.count} requested attempts exceed "
            f"max-concurrent-executions {limit}"
        )
    return None


def _apply_speculate(c: r.LaunchSpeculativeAttempts, job: JobActions, fallback: bool) -> None:
    subtask = job.state.vertices[c.vertex].subtasks[c.subtask]
    avoid = frozenset(c.avoid_hosts) | {a.host for a in subtask.live_attempts()}
    job.request_speculative(ExecutionVertexId(c.vertex, c.subtask), c.id, c.count, avoid)


# --------------------------------------------------------------------------- blocking


def _guard_block(c: r.BlockNodes, view: JobView) -> str | None:
    if not c.hosts:
        return "no hosts to block"
    hosts = view.hosts
    unknown = [h for h in c.hosts if h not in hosts]
    if unknown:
        return f"unknown host(s) {unknown}"
    if c.until_ts <= c.ts:
        return f"until_ts {c.until_ts} is not after the command's ts {c.ts}"
    # The opt-out holds for the whole run, not only the list read at start. Read only for the
    # fleet's blocks: a job's own evidence blocks hosts whatever the setting.
    if is_fleet_cause(c.cause) and not view.settings.flag(FLEET_SETTING):
        return f"job opted out of the fleet blocklist ({FLEET_SETTING} = false)"
    # The same rule, written once, that the blocklist service applies before it blocks.
    return blocked_fraction_problem(view.pool.blocked(), c.hosts, hosts, view.max_blocked_fraction)


def _apply_block(c: r.BlockNodes, job: JobActions, fallback: bool) -> None:
    for host in c.hosts:
        job.block_host(host, c.until_ts, c.cause, c.id)


def _guard_unblock(c: r.UnblockNodes, view: JobView) -> str | None:
    unknown = [h for h in c.hosts if h not in view.hosts]
    if unknown:
        return f"unknown host(s) {unknown}"
    return None


def _apply_unblock(c: r.UnblockNodes, job: JobActions, fallback: bool) -> None:
    for host in c.hosts:
        if host in job.pool.blocked():
            job.unblock_host(host, c.id)


# --------------------------------------------------------------------------- failover


def _guard_restart(c: r.RestartTasks, view: JobView) -> str | None:
    if not c.tasks:
        return "no tasks to restart"
    for task in c.tasks:
        problem = _subtask_problem(view, task.vertex, task.subtask)
        if problem:
            return problem
    return None


def _apply_restart(c: r.RestartTasks, job: JobActions, fallback: bool) -> None:
    for task in c.tasks:
        job.restart_task(ExecutionVertexId(task.vertex, task.subtask), c.not_before_ts)


def _guard_fail(c: r.FailJob, view: JobView) -> str | None:
    return None


def _apply_fail(c: r.FailJob, job: JobActions, fallback: bool) -> None:
    job.fail_job(c.reason)


HANDLERS: Mapping[type[r.Command], Handler[Any]] = {
    r.SetParallelism: Handler(_guard_set_parallelism, _apply_set_parallelism),
    r.LaunchSpeculativeAttempts: Handler(_guard_speculate, _apply_speculate),
    r.BlockNodes: Handler(_guard_block, _apply_block),
    r.UnblockNodes: Handler(_guard_unblock, _apply_unblock),
    r.RestartTasks: Handler(_guard_restart, _apply_restart),
    r.FailJob: Handler(_guard_fail, _apply_fail),
}


def handler_for(command: r.Command) -> Handler[Any] | None:
    return HANDLERS.get(type(command))
