"""The policies tailguard is compared with: none, Spark's rule and LATE.

Both speculating baselines run at most one mirror per task (Spark's and Hadoop's behaviour) and
place it on another host than the task's running attempt; neither blocks hosts.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from functools import partial

from sim.engine import Attempt, Policy, Simulation, Task
from tailguard.agent.driver.ordering import SubtaskOrder

# Spark's MedianHeap of task durations is the same two-heap median the progress rule keeps.
from tailguard.detector.policy.progress import RunningMedian
from tailguard.model.percentile import percentile


class NoSpeculation(Policy):
    name = "none"


@dataclass(frozen=True)
class SparkConfig:
    quantile: float = 0.75  # spark.speculation.quantile
    multiplier: float = 1.5  # spark.speculation.multiplier
    min_task_runtime_ms: int = 100  # spark.speculation.minTaskRuntime
    interval_ms: int = 100  # spark.speculation.interval

    def describe(self) -> str:
        return (
            f"spark     spark.speculation.quantile={self.quantile:g},"
            f" multiplier={self.multiplier:g}, minTaskRuntime={self.min_task_runtime_ms} ms,"
            f" interval={self.interval_ms} ms; one extra copy; no host blocking"
        )


class SparkRule(Policy):
    """TaskSetManager.checkSpeculatableTasks: once quantile × N tasks of the stage succeeded, a
    running task whose runtime exceeds max(multiplier × median successful duration,
    minTaskRuntime) becomes speculatable; it gets one copy on another host at the next offer."""

    name = "spark"

    def __init__(self, config: SparkConfig | None = None) -> None:
        self.config = config or SparkConfig()
        self.interval_ms = self.config.interval_ms
        self._durations = RunningMedian()
        self._succeeded = 0
        # Tasks with one running attempt, not yet speculatable, in start order.
        self._candidates: dict[Task, int] = {}
        self._speculatable: deque[Task] = deque()

    def stage_started(self, stage: int) -> None:
        self._durations = RunningMedian()
        self._succeeded = 0

    def deployed(self, attempt: Attempt) -> None:
        if not attempt.speculative:
            self._candidates[attempt.task] = attempt.start

    def finished(self, attempt: Attempt) -> None:
        self._candidates.pop(attempt.task, None)
        self._durations.add(attempt.duration)
        self._succeeded += 1

    def check(self) -> None:
        n = len(self.sim.stages[self.sim.active_stage])
        if self._succeeded < max(math.floor(self.config.quantile * n), 1):
            return
        median = self._durations.median()
        assert median is not None, "checked only once a task has succeeded"
        threshold = max(self.config.multiplier * median, self.config.min_task_runtime_ms)
        now = self.sim.now
        marked: list[Task] = []
        for task, start in self._candidates.items():
            if now - start <= threshold:
                break  # the rest started later
            marked.append(task)
        for task in marked:
            del self._candidates[task]
            self._speculatable.append(task)

    def wants_slots(self) -> bool:
        return bool(self._speculatable)

    def place_speculative(self) -> None:
        waiting: deque[Task] = deque()
        while self._speculatable and self.sim.free:
            task = self._speculatable.popleft()
            if task.done:
                continue
            hosts = {a.host for a in task.live}
            host = self.sim.take_slot(hosts.__contains__)
            if host is None:
                waiting.append(task)
                continue
            self.sim.deploy(task, host, True)
        waiting.extend(self._speculatable)
        self._speculatable = waiting


@dataclass(frozen=True)
class LateConfig:
    slow_task_percentile: float = 0.25  # SlowTaskThreshold
    slow_node_percentile: float = 0.25  # SlowNodeThreshold
    speculative_cap: float = 0.10  # SpeculativeCap, of all slots
    interval_ms: int = 1_000  # how often free slots ask for work (a heartbeat)

    def describe(self) -> str:
        return (
            f"LATE      SlowTaskThreshold={self.slow_task_percentile:.0%} percentile of progress"
            f" rates, SlowNodeThreshold={self.slow_node_percentile:.0%} percentile of node"
            f" progress, SpeculativeCap={self.speculative_cap:.0%} of slots, heartbeat"
            f" {self.interval_ms} ms; one extra copy; progress = elapsed / attempt time (exact)"
        )


class Late(Policy):
    """LATE (Zaharia et al., OSDI 2008). When a slot is free and no task is pending: if fewer
    than SpeculativeCap mirrors run and the slot's node is not slow (its total progress is not
    below the SlowNodeThreshold percentile), copy the running task with the longest estimated
    time left, (1 − progress) / rate, among those whose progress rate is below the
    SlowTaskThreshold percentile."""

    name = "LATE"

    def __init__(self, config: LateConfig | None = None) -> None:
        self.config = config or LateConfig()
        self.interval_ms = self.config.interval_ms
        self._completed: list[float] = []
        self._running_mirrors = 0
        self._cap = 1

    def attach(self, sim: Simulation) -> None:
        super().attach(sim)
        params = sim.scenario.params
        self._completed = [0.0] * params.hosts
        self._cap = max(1, math.floor(self.config.speculative_cap * params.hosts * params.slots))

    def deployed(self, attempt: Attempt) -> None:
        if attempt.speculative:
            self._running_mirrors += 1

    def finished(self, attempt: Attempt) -> None:
        self._completed[attempt.host] += 1.0
        if attempt.speculative:
            self._running_mirrors -= 1

    def canceled(self, attempt: Attempt) -> None:
        if attempt.speculative:
            self._running_mirrors -= 1

    def copyable(self, task: Task) -> bool:
        """Whether LATE may copy `task`: any task (a diagnostic subclass narrows it)."""
        return True

    def check(self) -> None:
        sim = self.sim
        if not sim.free or sim.pending or self._running_mirrors >= self._cap:
            return
        now = sim.now
        node_progress = list(self._completed)
        rates: list[float] = []
        candidates: list[tuple[float, int, Task]] = []
        for attempt in sim.running:
            elapsed = now - attempt.start
            progress = min(1.0, elapsed / attempt.duration)
            node_progress[attempt.host] += progress
            if elapsed <= 0 or attempt.speculative:
                continue
            rate = progress / elapsed
            rates.append(rate)
            if len(attempt.task.live) == 1 and self.copyable(attempt.task):
                candidates.append((rate, attempt.task.index, attempt.task))
        if not candidates:
            return
        slow_rate = percentile(rates, 100 * self.config.slow_task_percentile)
        slow_node = percentile(node_progress, 100 * self.config.slow_node_percentile)
        ranked = sorted(
            ((_time_left(now, t), index, t) for rate, index, t in candidates if rate < slow_rate),
            key=lambda item: (-item[0], item[1]),
        )

        def refused(host: int, busy: int) -> bool:
            return host == busy or node_progress[host] < slow_node

        for _, _, task in ranked:
            if self._running_mirrors >= self._cap or not sim.free:
                return
            busy = task.live[0].host
            host = sim.take_slot(partial(refused, busy=busy))
            if host is not None:
                sim.deploy(task, host, True)


class LateOracle(Late):
    """LATE told which tasks are only skewed (skewed, first attempt on a healthy host: an oracle
    no real system has) and never copying them; everything else as LATE. A diagnostic: the gap
    between it and LATE is what LATE's job time owes to copies of only-skewed tasks, which win
    only on attempt noise (`--policies LATE,LATE-oracle`)."""

    name = "LATE-oracle"

    def attach(self, sim: Simulation) -> None:
        super().attach(sim)
        self._slow_hosts = sim.scenario.slow_hosts

    def copyable(self, task: Task) -> bool:
        skewed = self.sim.scenario.stages[task.stage].skewed[task.subtask]
        return not (skewed and task.live[0].host not in self._slow_hosts)


class LateLargestFirst(Late):
    """LATE on a scheduler that starts each stage's largest tasks first (the agent's
    `scheduler.subtask-order=largest-input-first`). A diagnostic: what the ordering is worth to
    LATE, so tailguard-progress-lpt is also compared on equal scheduling (`--policies
    LATE,LATE-lpt`)."""

    name = "LATE-lpt"
    subtask_order = SubtaskOrder.LARGEST_INPUT_FIRST


def _time_left(now: int, task: Task) -> float:
    attempt = task.live[0]
    elapsed = now - attempt.start
    progress = min(1.0, elapsed / attempt.duration)
    rate = progress / elapsed
    return (1.0 - progress) / rate
