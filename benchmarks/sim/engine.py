"""Discrete-event engine: simulated milliseconds, slots, attempts, first finisher wins.

The engine owns what every policy shares — placing pending tasks on free slots in the order the
slots were freed, stage barriers, finishing the first attempt of a task and cancelling the others
— and calls a `Policy`'s hooks, so the policies differ only in when they ask for a mirror attempt
and where they allow attempts to go. Events at the same instant run finishes first, then policy
wake-ups, then periodic checks, each in the order they were scheduled, so a run is a pure
function of the scenario and the policy.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from sim.scenario import Scenario
from tailguard.agent.driver.ordering import SubtaskOrder, ordered

_FINISH, _WAKE, _CHECK = 0, 1, 2


class Task:
    __slots__ = ("attempts", "done", "index", "live", "stage", "subtask")

    def __init__(self, stage: int, subtask: int, index: int) -> None:
        self.stage = stage
        self.subtask = subtask
        self.index = index  # global, for keyed per-attempt noise
        self.live: list[Attempt] = []
        self.attempts = 0
        self.done = False


class Attempt:
    __slots__ = ("alive", "end", "ended", "host", "number", "speculative", "start", "task")

    def __init__(
        self, task: Task, number: int, host: int, start: int, end: int, speculative: bool
    ) -> None:
        self.task = task
        self.number = number
        self.host = host
        self.start = start
        self.end = end
        self.ended = end
        self.speculative = speculative
        self.alive = True

    @property
    def duration(self) -> int:
        return self.end - self.start


class Policy:
    """Hooks a speculation policy implements; the defaults do nothing (the "none" baseline)."""

    name = "none"
    # The order a stage's tasks take free slots in (the agent's `scheduler.subtask-order`).
    subtask_order = SubtaskOrder.INDEX
    # Period of `check`, in simulated ms; None for no periodic check.
    interval_ms: int | None = None

    def attach(self, sim: Simulation) -> None:
        self.sim = sim

    def stage_started(self, stage: int) -> None: ...

    def deployed(self, attempt: Attempt) -> None: ...

    def finished(self, attempt: Attempt) -> None: ...

    def canceled(self, attempt: Attempt) -> None: ...

    def check(self) -> None: ...

    def wake(self) -> None: ...

    def wants_slots(self) -> bool:
        """Whether `place_speculative` has anything to place."""
        return False

    def place_speculative(self) -> None: ...

    def job_finished(self) -> None: ...

    # Whether `blocked` can ever say yes; the engine skips the check otherwise.
    blocks_hosts = False

    def blocked(self, host: int) -> bool:
        """Whether `host` may take no new attempt now. A free slot found on a blocked host is
        parked until the policy calls `Simulation.unpark` for that host."""
        return False

    def hosts_blocked(self) -> tuple[int, ...]:
        """Hosts this policy ever blocked."""
        return ()


@dataclass(frozen=True)
class Outcome:
    policy: str
    completion_ms: int
    tasks: int
    speculative_attempts: int
    speculative_wins: int
    # Simulated ms run by speculative attempts, whether they won, lost or were cut short.
    speculative_work_ms: int
    # Speculative attempts of skewed tasks / of tasks whose first attempt ran on a slow host.
    speculated_skewed: int
    speculated_on_slow: int
    # Speculative attempts of skewed tasks whose first attempt ran on a healthy host: copies of
    # a task that was only skewed, which cannot help.
    speculated_skew_only: int
    # Of those, the ones that finished first (a luckier attempt of a long task).
    skew_only_wins: int
    hosts_blocked: tuple[int, ...]
    slow_hosts_blocked: int
    wall_seconds: float
    # What ended each stage (its last task's winner), for `--trace`.
    stage_ends: tuple[StageEnd, ...] = ()
    # Simulated ms from a slow-host first attempt's start to its copy's, one per such copy.
    slow_host_copy_delays_ms: tuple[int, ...] = ()
    # Likewise to the policy's asking for the copy (tailguard's commands; `Simulation.asked`).
    slow_host_ask_delays_ms: tuple[int, ...] = ()


@dataclass(frozen=True)
class StageEnd:
    """The task that ended a stage: when it and its winner started, whether it was skewed,
    whether its first attempt ran on a slow host, and whether the winner was a copy."""

    stage: int
    end_ms: int
    subtask: int
    skewed: bool
    first_on_slow_host: bool
    first_start_ms: int
    winner_start_ms: int
    winner_speculative: bool
    # When the stage's last first attempt started (its last wave).
    last_first_start_ms: int


Progress = Callable[[str, int, int], None]


class Simulation:
    def __init__(
        self,
        scenario: Scenario,
        policy: Policy,
        progress: Progress | None = None,
        progress_every: int = 5_000,
    ) -> None:
        self.scenario = scenario
        self.policy = policy
        self.now = 0
        self.free: deque[int] = deque(scenario.initial_slots)
        # host -> free slots set aside while the host is blocked
        self._parked: dict[int, int] = {}
        self.stages: list[list[Task]] = []
        for stage in scenario.stages:
            offset = scenario.stage_offsets[stage.index]
            self.stages.append([Task(stage.index, s, offset + s) for s in range(stage.parallelism)])
        self.active_stage = -1
        self.remaining = 0
        self.pending: deque[Task] = deque()
        # Live attempts of the active stage, oldest first (insertion = deploy order).
        self.running: dict[Attempt, None] = {}
        self.finished_tasks = 0
        self._heap: list[tuple[int, int, int, Attempt | None]] = []
        self._seq = 0
        self._progress = progress
        self._progress_every = progress_every
        self._done = False
        self._speculative = 0
        self._wins = 0
        self._speculative_work = 0
        self._speculated_skewed = 0
        self._speculated_on_slow = 0
        self._speculated_skew_only = 0
        self._skew_only_wins = 0
        self._slow = scenario.slow_hosts
        self._stage_ends: list[StageEnd] = []
        self._copy_delays: list[int] = []
        self._ask_delays: list[int] = []
        # task -> (its first attempt's start, host); the stage's last first-attempt start.
        self._first: dict[Task, tuple[int, int]] = {}
        self._last_first_start = 0

    # ------------------------------------------------------------------ run

    def run(self) -> Outcome:
        started = time.perf_counter()
        self.policy.attach(self)
        self._start_stage(0)
        if self.policy.interval_ms:
            self._push(self.policy.interval_ms, _CHECK, None)
        self._dispatch()
        heap = self._heap
        while not self._done:
            when, kind, _, attempt = heapq.heappop(heap)
            self.now = when
            if kind == _FINISH:
                assert attempt is not None
                if not attempt.alive:
                    continue  # cancelled earlier
                self._finish(attempt)
            elif kind == _WAKE:
                self.policy.wake()
            else:
                self.policy.check()
                interval = self.policy.interval_ms
                assert interval
                self._push(when + interval, _CHECK, None)
            if not self._done:
                self._dispatch()
        self.policy.job_finished()
        blocked = self.policy.hosts_blocked()
        return Outcome(
            policy=self.policy.name,
            completion_ms=self.now,
            tasks=self.finished_tasks,
            speculative_attempts=self._speculative,
            speculative_wins=self._wins,
            speculative_work_ms=self._speculative_work,
            speculated_skewed=self._speculated_skewed,
            speculated_on_slow=self._speculated_on_slow,
            speculated_skew_only=self._speculated_skew_only,
            skew_only_wins=self._skew_only_wins,
            hosts_blocked=blocked,
            slow_hosts_blocked=sum(1 for h in blocked if h in self._slow),
            wall_seconds=time.perf_counter() - started,
            stage_ends=tuple(self._stage_ends),
            slow_host_copy_delays_ms=tuple(self._copy_delays),
            slow_host_ask_delays_ms=tuple(self._ask_delays),
        )

    def _push(self, when: int, kind: int, attempt: Attempt | None) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (when, kind, self._seq, attempt))

    def wake_at(self, when: int) -> None:
        """Call the policy's `wake` at `when` (e.g. when a delayed command arrives)."""
        self._push(max(when, self.now), _WAKE, None)

    # ------------------------------------------------------------------ placement

    def take_slot(self, avoid: Callable[[int], bool] | None = None) -> int | None:
        """The longest-free slot on a host that is neither blocked nor refused by `avoid`.

        Slots of blocked hosts are parked (a block lasts, and rescanning them for every
        placement would make placement quadratic); slots refused by `avoid` keep their place.
        """
        free = self.free
        blocked = self.policy.blocked if self.policy.blocks_hosts else None
        skipped: list[int] = []
        host = None
        while free:
            candidate = free.popleft()
            if blocked is not None and blocked(candidate):
                self._parked[candidate] = self._parked.get(candidate, 0) + 1
                continue
            if avoid is not None and avoid(candidate):
                skipped.append(candidate)
                continue
            host = candidate
            break
        free.extendleft(reversed(skipped))
        return host

    def unpark(self, host: int) -> None:
        """A block on `host` ended: its parked free slots join the line again."""
        self.free.extend([host] * self._parked.pop(host, 0))

    def asked(self, task: Task) -> None:
        """A policy decided to copy `task` now (it may start later, when a slot is free)."""
        first = self._first.get(task)
        if first is not None and first[1] in self._slow:
            self._ask_delays.append(self.now - first[0])

    def deploy(self, task: Task, host: int, speculative: bool) -> Attempt:
        number = task.attempts
        task.attempts += 1
        scenario = self.scenario
        stage = scenario.stages[task.stage]
        seconds = (
            stage.intrinsic_ms[task.subtask]
            * scenario.host_time_factor(host, task.stage, self.now)
            * scenario.attempt_noise(task.index, number)
        )
        attempt = Attempt(
            task, number, host, self.now, self.now + max(1, round(seconds)), speculative
        )
        task.live.append(attempt)
        self.running[attempt] = None
        if number == 0:
            self._first[task] = (self.now, host)
            self._last_first_start = self.now
        if speculative:
            self._speculative += 1
            first_start, first_host = self._first[task]
            if first_host in self._slow:
                self._copy_delays.append(self.now - first_start)
            if stage.skewed[task.subtask]:
                self._speculated_skewed += 1
                if task.live[0].host not in self._slow:
                    self._speculated_skew_only += 1
            if task.live[0].host in self._slow:
                self._speculated_on_slow += 1
        self._push(attempt.end, _FINISH, attempt)
        self.policy.deployed(attempt)
        return attempt

    def _dispatch(self) -> None:
        """Pending tasks first (they have priority over mirrors), then the policy's mirrors."""
        free = self.free
        if self.pending and free:
            while self.pending and free:
                host = self.take_slot()
                if host is None:
                    break
                self.deploy(self.pending.popleft(), host, False)
        if free and self.policy.wants_slots():
            self.policy.place_speculative()

    # ------------------------------------------------------------------ lifecycle

    def _start_stage(self, index: int) -> None:
        self.active_stage = index
        tasks = self.stages[index]
        self.remaining = len(tasks)
        sizes = self.scenario.stages[index].input_bytes
        self.pending.extend(ordered(tasks, lambda t: sizes[t.subtask], self.policy.subtask_order))
        self.policy.stage_started(index)

    def _end(self, attempt: Attempt) -> None:
        attempt.alive = False
        attempt.ended = self.now
        del self.running[attempt]
        self.free.append(attempt.host)
        if attempt.speculative:
            self._speculative_work += self.now - attempt.start

    def _finish(self, winner: Attempt) -> None:
        task = winner.task
        self._end(winner)
        task.done = True
        task.live.remove(winner)
        if winner.speculative:
            self._wins += 1
            stage = self.scenario.stages[task.stage]
            if stage.skewed[task.subtask] and task.live and task.live[0].host not in self._slow:
                self._skew_only_wins += 1
        self.policy.finished(winner)
        for other in task.live:
            self._end(other)
            self.policy.canceled(other)
        task.live.clear()
        self.finished_tasks += 1
        self.remaining -= 1
        if self._progress and self.finished_tasks % self._progress_every == 0:
            self._progress(self.policy.name, self.now, self.finished_tasks)
        if self.remaining == 0:
            first_start, first_host = self._first[task]
            self._stage_ends.append(
                StageEnd(
                    stage=task.stage,
                    end_ms=self.now,
                    subtask=task.subtask,
                    skewed=self.scenario.stages[task.stage].skewed[task.subtask],
                    first_on_slow_host=first_host in self._slow,
                    first_start_ms=first_start,
                    winner_start_ms=winner.start,
                    winner_speculative=winner.speculative,
                    last_first_start_ms=self._last_first_start,
                )
            )
            self._first.clear()
            if self.active_stage + 1 < len(self.stages):
                self._start_stage(self.active_stage + 1)
            else:
                self._done = True
