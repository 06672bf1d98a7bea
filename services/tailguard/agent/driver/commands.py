"""Every command is checked against the job's current state before it changes anything.

A rejected command is answered with `CommandRejected` and a reason a person can act on; the job
goes on.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tailguard.model import records as r
from tailguard.model.records import SPLITS_INPUT

if TYPE_CHECKING:
    from tailguard.agent.driver.driver import JobRunner


class CommandValidator:
    def __init__(self, runner: JobRunner) -> None:
        self.runner = runner

    def reject_reason(self, command: r.Command) -> str | None:
        check = getattr(self, f"_check_{type(command).__name__}", None)
        if check is None:
            return f"unknown command type {type(command).__name__}"
        reason: str | None = check(command)
        return reason

    # ------------------------------------------------------------------ helpers

    def _vertex(self, name: str) -> str | None:
        if name not in self.runner.state.vertices:
            return f"unknown vertex {name!r}"
        return None

    def _subtask(self, vertex: str, index: int) -> str | None:
        problem = self._vertex(vertex)
        if problem:
            return problem
        v = self.runner.state.vertices[vertex]
        if not v.initialized:
            return f"vertex {vertex!r} is not initialised yet"
        if not 0 <= index < len(v.subtasks):
            return f"unknown subtask {vertex}#{index} (parallelism {v.parallelism})"
        return None

    # ------------------------------------------------------------------ per command

    def _check_SetParallelism(self, c: r.SetParallelism) -> str | None:
        state = self.runner.state
        problem = self._vertex(c.vertex)
        if problem:
            return problem
        vertex = state.vertices[c.vertex]
        if vertex.initialized:
            return (
                f"vertex {c.vertex!r} is already initialised with parallelism {vertex.parallelism}"
            )
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
        expected = {i.producer for i in vertex.definition.inputs}
        if vertex.definition.source is not None:
            expected = {SPLITS_INPUT}
        for s in c.subtask_inputs:
            names = [i.input for i in s.inputs]
            if sorted(names) != sorted(expected):
                return f"subtask {s.subtask}: inputs {sorted(names)} != {sorted(expected)}"
            for rng in s.inputs:
                problem = self._range_problem(c.vertex, rng)
                if problem:
                    return f"subtask {s.subtask}: {problem}"
        for producer in expected - {SPLITS_INPUT}:
            if not state.vertices[producer].initialized:
                return f"input {producer!r} is not initialised yet"
        return None

    def _range_problem(self, vertex: str, rng: r.InputRange) -> str | None:
        state = self.runner.state
        if rng.input == SPLITS_INPUT:
            count = len(self.runner.splits.get(vertex, []))
            if not 0 <= rng.partition_start <= rng.partition_end < count:
                return (
                    f"split range {rng.partition_start}..{rng.partition_end} outside 0..{count - 1}"
                )
            return None
        producer = state.vertices[rng.input]
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

    def _check_LaunchSpeculativeAttempts(self, c: r.LaunchSpeculativeAttempts) -> str | None:
        problem = self._subtask(c.vertex, c.subtask)
        if problem:
            return problem
        if c.count < 1:
            return f"count must be at least 1, got {c.count}"
        vertex = self.runner.state.vertices[c.vertex]
        if not vertex.definition.speculation_safe:
            return f"vertex {c.vertex!r} is declared unsafe for speculation"
        subtask = vertex.subtasks[c.subtask]
        if subtask.winner is not None:
            return f"subtask {c.vertex}#{c.subtask} already finished"
        region = self.runner.state.region_of(c.vertex, c.subtask)
        if region is not None:
            # Its pipelined partners read (or feed) one specific attempt, deployed with them.
            return (
                f"subtask {c.vertex}#{c.subtask} is in a pipelined region of {len(region)} tasks; "
                f"speculation needs a blocking input and output"
            )
        live = len(subtask.live_attempts())
        if live == 0:
            return f"subtask {c.vertex}#{c.subtask} has no running attempt to mirror"
        queued = sum(
            1
            for req in self.runner.pool.pending()
            if isinstance(req.key, tuple)
            and req.key[0] == "speculative"
            and (c.vertex, c.subtask) in req.tasks
        )
        limit = self.runner.max_concurrent
        if live + queued + c.count > limit:
            return (
                f"{live} running + {queued} queued + {c.count} requested attempts exceed "
                f"max-concurrent-executions {limit}"
            )
        return None

    def _check_BlockNodes(self, c: r.BlockNodes) -> str | None:
        pool = self.runner.pool
        if not c.hosts:
            return "no hosts to block"
        unknown = [h for h in c.hosts if h not in pool.hosts]
        if unknown:
            return f"unknown host(s) {unknown}"
        if c.until_ts <= c.ts:
            return f"until_ts {c.until_ts} is not after the command's ts {c.ts}"
        fraction = self.runner.settings.number("blocklist.max-blocked-fraction")
        after = set(pool.blocked()) | set(c.hosts)
        limit = math.floor(fraction * len(pool.hosts))
        if len(after) > limit:
            return (
                f"blocking {sorted(after)} would block {len(after)} of {len(pool.hosts)} hosts, "
                f"over blocklist.max-blocked-fraction {fraction}"
            )
        return None

    def _check_UnblockNodes(self, c: r.UnblockNodes) -> str | None:
        unknown = [h for h in c.hosts if h not in self.runner.pool.hosts]
        if unknown:
            return f"unknown host(s) {unknown}"
        return None

    def _check_RestartTasks(self, c: r.RestartTasks) -> str | None:
        if not c.tasks:
            return "no tasks to restart"
        for task in c.tasks:
            problem = self._subtask(task.vertex, task.subtask)
            if problem:
                return problem
        return None

    def _check_FailJob(self, c: r.FailJob) -> str | None:
        return None
