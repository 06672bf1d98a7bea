"""LocalFallbacks: the decider and failover decisions the agent takes itself when no service
answers: at once with the services off, at the deadline with them on, never when the service's
own command (same deterministic id) came first."""

from __future__ import annotations

from typing import Any

from tailguard.agent.driver.fallbacks import LocalFallbacks
from tailguard.model import records as r
from tailguard.model.config import Settings

SETTINGS = {
    "decider.timeout": "10 s",
    "failover.timeout": "5 s",
    "restart-strategy.type": "fixed-delay",
    "restart-strategy.fixed-delay.delay": "0 ms",
}
GRAPH = r.JobGraphSpec(
    vertices=(
        r.VertexSpec("src", r.VertexKind.SOURCE, parallelism=1, split_bytes=(10,)),
        r.VertexSpec("a", r.VertexKind.SOURCE, split_bytes=(10, 10)),  # adaptive
        r.VertexSpec("out", r.VertexKind.SINK, parallelism=1),
        r.VertexSpec("out_a", r.VertexKind.SINK),
    ),
    edges=(
        r.EdgeSpec("src", "out", r.Distribution.FORWARD),
        r.EdgeSpec("a", "out_a", r.Distribution.FORWARD),
    ),
)


class Events:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self, cls: type[r.Event], ts: int, **fields: Any) -> r.Event:
        self.n += 1
        return cls(job_id="j", ts=ts, id=f"e{self.n}", **fields)


def submitted(fallbacks: LocalFallbacks, event: Events, ts: int = 1000) -> None:
    fallbacks.observe(event(r.JobSubmitted, ts, name="j", graph=GRAPH, config={}))


def failed_src(fallbacks: LocalFallbacks, event: Events, ts: int = 2000) -> None:
    splits = (r.SubtaskInputs(0, (r.InputRange(r.SPLITS_INPUT, 0, 0, 0, 0),)),)
    fallbacks.observe(
        event(
            r.VertexInitialized,
            ts,
            vertex="src",
            parallelism=1,
            subtask_inputs=splits,
            decided_by="fixed",
        )
    )
    fallbacks.observe(event(r.AttemptDeploying, ts, vertex="src", subtask=0, attempt=0, host="h"))
    fallbacks.observe(
        event(
            r.AttemptFailed,
            ts,
            vertex="src",
            subtask=0,
            attempt=0,
            host="h",
            error=r.ErrorKind.USER,
            message="boom",
        )
    )


def test_services_off_applies_at_once() -> None:
    fallbacks = LocalFallbacks(Settings(SETTINGS), services=False)
    event = Events()
    assert fallbacks.next_deadline() is None
    submitted(fallbacks, event, ts=1000)
    assert fallbacks.next_deadline() == 1000  # the event's own time
    assert fallbacks.due(999) == []
    (due,) = fallbacks.due(1000)
    assert isinstance(due.command, r.SetParallelism) and due.command.vertex == "a"
    assert due.command.caused_by == ("e1",)
    assert due.note == f"decider: services off, applied local SetParallelism {due.command.id}"
    # Settled by being due: not again.
    assert fallbacks.due(10**12) == [] and fallbacks.next_deadline() is None


def test_services_on_waits_for_the_deadline() -> None:
    fallbacks = LocalFallbacks(Settings(SETTINGS), services=True)
    event = Events()
    submitted(fallbacks, event, ts=1000)
    assert fallbacks.next_deadline() == 11_000  # ts + decider.timeout
    assert fallbacks.due(10_999) == []
    (due,) = fallbacks.due(11_000)
    assert isinstance(due.command, r.SetParallelism)
    assert due.note == (
        f"decider: no service answered in time, applied local SetParallelism {due.command.id}"
    )


def test_the_service_command_with_the_same_id_settles_the_pending_one() -> None:
    fallbacks = LocalFallbacks(Settings(SETTINGS), services=True)
    event = Events()
    submitted(fallbacks, event)
    # The decider service runs the same core on the same event: the same id.
    twin = LocalFallbacks(Settings(SETTINGS), services=False)
    submitted(twin, Events())
    (service,) = twin.due(10**12)
    fallbacks.settle("some-other-id")
    assert fallbacks.next_deadline() == 11_000
    fallbacks.settle(service.command.id)
    assert fallbacks.next_deadline() is None
    assert fallbacks.due(10**12) == []
    # A later event that makes the core decide the same command again does not revive it.
    submitted(fallbacks, event, ts=5000)
    assert fallbacks.due(10**12) == []


def test_due_is_oldest_deadline_first_with_a_note_each() -> None:
    fallbacks = LocalFallbacks(Settings(SETTINGS), services=True)
    event = Events()
    submitted(fallbacks, event, ts=1000)  # SetParallelism due at 11 000
    failed_src(fallbacks, event, ts=2000)  # RestartTasks due at 7 000
    assert fallbacks.next_deadline() == 7000
    assert fallbacks.due(6999) == []
    first = fallbacks.due(7000)
    assert [type(f.command) for f in first] == [r.RestartTasks]
    assert first[0].note.startswith("failover: no service answered in time, applied local ")
    assert fallbacks.next_deadline() == 11_000
    assert [type(f.command) for f in fallbacks.due(11_000)] == [r.SetParallelism]


def test_due_orders_by_deadline_then_id_when_both_are_late() -> None:
    fallbacks = LocalFallbacks(Settings(SETTINGS), services=True)
    event = Events()
    submitted(fallbacks, event, ts=1000)
    failed_src(fallbacks, event, ts=2000)
    due = fallbacks.due(10**12)
    assert [type(f.command) for f in due] == [r.RestartTasks, r.SetParallelism]
    restart = due[0].command
    assert isinstance(restart, r.RestartTasks) and restart.tasks == (r.TaskRef("src", 0),)
    assert [f.note.split(":")[0] for f in due] == ["failover", "decider"]

    no_wait = {**SETTINGS, "failover.timeout": "0 s", "decider.timeout": "0 s"}
    same_deadline = LocalFallbacks(Settings(no_wait), services=True)
    e2 = Events()
    submitted(same_deadline, e2, ts=1000)
    failed_src(same_deadline, e2, ts=1000)  # both due at 1 000: by id
    ids = [f.command.id for f in same_deadline.due(1000)]
    assert len(ids) == 2 and ids == sorted(ids)
