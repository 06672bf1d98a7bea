"""Sink commits run off the driver's thread: the driver goes on handling its inbox while a
commit is in flight, and records the winner's AttemptFinished only once the commit is back
(storage_io.StorageWorker, outcomes.Outcomes)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_fakes import WAIT_S, FakeRuntime, Harness, write_parquet_input

from tailguard.agent.driver import plans
from tailguard.agent.driver.ports import CommandReceived, RunnerConnected
from tailguard.agent.executor.storage import Storage
from tailguard.agent.graph.api import Job
from tailguard.model import records as r

TASK = ("src→out", 0, 0)


class HeldCommit:
    """`plans.commit` as it is, except that the first call waits until `release` is set."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.threads: list[str] = []
        self._commit = plans.commit

    def __call__(self, *args: object, **kwargs: object) -> None:
        self.threads.append(threading.current_thread().name)
        if not self.entered.is_set():
            self.entered.set()
            assert self.release.wait(WAIT_S), "the test did not release the commit"
        self._commit(*args, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Iterator[HeldCommit]:
    commit = HeldCommit()
    monkeypatch.setattr(plans, "commit", commit)
    yield commit
    commit.release.set()


def one_task_job(tmp_path: Path) -> Job:
    job = Job("one")
    source = job.read_parquet(str(write_parquet_input(tmp_path / "in.parquet")), name="src")
    source.with_parallelism(1).write_parquet(str(tmp_path / "out"), name="out", parallelism=1)
    return job


def handled(h: Harness, message: object) -> None:
    """Post `message` and wait until the driver has handled it, storage work or not."""
    mark = h.inbox.mark()
    h.inbox.put(message)  # type: ignore[arg-type]
    h.inbox.wait_idle_after(mark)


def of(h: Harness, cls: type[r.Event]) -> list[r.Event]:
    return [e for e in h.publisher.events if isinstance(e, cls)]


def test_the_driver_handles_its_inbox_while_a_sink_commit_runs(
    tmp_path: Path, held: HeldCommit
) -> None:
    runtime = FakeRuntime.hosts(h1=1)
    h = Harness(one_task_job(tmp_path), runtime, Storage(str(tmp_path / "st"))).start()
    handled(h, runtime.execute(TASK))
    assert held.entered.wait(WAIT_S)
    # The commit is held: a runner joining is still handled, and the winner is not yet finished.
    handled(h, RunnerConnected("h2/s0", "h2", 1))
    assert [e.host for e in of(h, r.NodeAdded)] == ["h1", "h2"]  # type: ignore[attr-defined]
    assert not of(h, r.AttemptFinished)
    assert not h.finished
    held.release.set()
    result = h.result()
    assert result.status == "SUCCEEDED", result.message
    assert held.threads and all(t.startswith("tailguard-storage") for t in held.threads)
    events = h.publisher.events
    added = events.index(of(h, r.NodeAdded)[1])
    assert events.index(of(h, r.AttemptFinished)[0]) > added
    assert (tmp_path / "out" / "part-00000.parquet").exists()


def test_a_restart_while_the_commit_runs_cancels_the_committing_attempt(
    tmp_path: Path, held: HeldCommit
) -> None:
    runtime = FakeRuntime.hosts(h1=1)
    h = Harness(one_task_job(tmp_path), runtime, Storage(str(tmp_path / "st"))).start()
    handled(h, runtime.execute(TASK))
    assert held.entered.wait(WAIT_S)
    now = h.driver.state.vertices["src→out"].subtasks[0].attempts[0].deployed_at
    restart = r.RestartTasks(
        job_id=h.driver.job_id,
        ts=now,
        id="failover-1",
        tasks=(r.TaskRef("src→out", 0),),
        reason="test",
        not_before_ts=0,
    )
    handled(h, CommandReceived(restart))
    assert runtime.wait_deployed(2), "the restarted subtask got no new attempt"
    assert not of(h, r.AttemptCanceled)  # its commit is still running
    mark = h.inbox.mark()
    held.release.set()
    h.inbox.wait_idle_after(mark, lambda: h.driver.storage_busy)
    (canceled,) = of(h, r.AttemptCanceled)
    assert (canceled.attempt, canceled.reason) == (0, r.CancelReason.RESTART)  # type: ignore[attr-defined]
    h.post(runtime.execute(("src→out", 0, 1)))
    result = h.result()
    assert result.status == "SUCCEEDED", result.message
    (finished,) = of(h, r.AttemptFinished)
    assert finished.attempt == 1  # type: ignore[attr-defined]
    assert [a.status for a in result.attempts] == ["CANCELED", "FINISHED"]
