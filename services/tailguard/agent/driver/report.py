"""What the job shows of itself: the progress bar while it runs, and its result at the end."""

from __future__ import annotations

from typing import Any

from tailguard.agent.driver import recovery
from tailguard.agent.driver.result import AttemptSummary, RecoverySummary
from tailguard.agent.driver.state import Attempt, ExecutionState
from tailguard.model import records as r


class Progress:
    """A tqdm bar of finished / known subtasks, with the running and speculative attempts."""

    def __init__(self, name: str, shown: bool) -> None:
        self._name = name
        self._shown = shown
        self._bar: Any = None

    def update(self, state: ExecutionState) -> None:
        if not self._shown:
            return
        done, known = state.counts()
        if self._bar is None:
            from tqdm import tqdm

            self._bar = tqdm(total=known, desc=self._name, unit="task", leave=False)
        self._bar.total = known
        self._bar.n = done
        live = state.live_attempts()
        self._bar.set_postfix(
            running=len(live), speculative=sum(1 for a in live if a.speculative), refresh=False
        )
        self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def attempt_summaries(state: ExecutionState, now: int) -> tuple[AttemptSummary, ...]:
    summaries = []
    for vertex in state.vertices.values():
        for subtask in vertex.subtasks:
            for a in subtask.attempts:
                end = a.finished_at or now
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
    return tuple(summaries)


def _error(attempt: Attempt) -> str | None:
    outcome = attempt.outcome
    return outcome.message if outcome is not None and not outcome.ok else None


def parallelism(state: ExecutionState) -> dict[str, tuple[int, str]]:
    return {v.name: (v.parallelism or 0, v.decided_by or "-") for v in state.vertices.values()}


def outputs(state: ExecutionState) -> dict[str, str]:
    return {
        v.name: v.definition.sink.path
        for v in state.vertices.values()
        if v.definition.sink is not None
    }


def recovery_summary(
    state: ExecutionState, job_log: recovery.JobLog | None, rebuilt: recovery.Recovered | None
) -> RecoverySummary | None:
    if rebuilt is None or job_log is None:
        return None
    before = sum(1 for e in rebuilt.events if isinstance(e, r.AttemptDeploying))
    after = sum(len(s.attempts) for v in state.vertices.values() for s in v.subtasks)
    return RecoverySummary(
        source=job_log.source,
        events_before=len(rebuilt.events),
        kept_results=rebuilt.kept_results,
        lost_attempts=len(rebuilt.lost_attempts),
        lost_results=len(rebuilt.lost_results),
        rerun_results=len(rebuilt.rerun_partitions),
        attempts_after=after - before,
    )
