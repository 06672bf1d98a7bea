"""Command handlers: each guard's rejection reasons and each apply's actions, against a fake
`JobActions`; and the driver's dispatch (unknown types, failing guards and applies, ids)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from agent_fakes import Harness, one_subtask_job

from tailguard.agent.driver import plans
from tailguard.agent.driver.commands import (
    HANDLERS,
    Handler,
    JobActions,
    handler_for,
)
from tailguard.agent.driver.slots import (
    ExecutionVertexId,
    SlotPool,
    SlotRequest,
    SpeculativeRequest,
)
from tailguard.agent.driver.state import Attempt, AttemptStatus, ExecutionState
from tailguard.agent.executor.sources import Split
from tailguard.agent.graph.api import Job
from tailguard.agent.graph.chaining import chain
from tailguard.model import records as r
from tailguard.model.records import SPLITS_INPUT, InputRange, SubtaskInputs

SPLITS = {"src": [Split(f"src/{k}", None, 10) for k in range(3)]}
SPLIT_COUNTS = {"src": 3, "a→out_a": 3, "u→out_u": 1, "p1": 1}


def ident(t: Any) -> Any:
    return t


def the_job() -> Job:
    """Chains (fixed unless said):
    src (3) =partition_by=> agg (adaptive, max 4) =partition_by=> fin→out (adaptive)
    src =rebalance=> f→out_f (3, left uninitialised)
    a→out_a (adaptive source)
    u→out_u (1, unsafe for speculation)
    p1 (1) -pipelined-> p2→out_p (1): one region of 2 tasks
    """
    job = Job("cmd")
    src = job.read_parquet("in", name="src", parallelism=3)
    agg = src.partition_by("k").map(ident, name="agg", max_parallelism=4)
    agg.partition_by("k").map(ident, name="fin").write_parquet("out", name="out")
    src.rebalance().map(ident, name="f", parallelism=3).write_parquet(
        "out_f", name="out_f", parallelism=3
    )
    job.read_parquet("in_a", name="a").write_parquet("out_a", name="out_a")
    u = job.read_parquet("in_u", name="u", parallelism=1).speculation_unsafe()
    u.write_parquet("out_u", name="out_u", parallelism=1)
    p1 = job.read_parquet("in_p", name="p1", parallelism=1)
    p2 = p1.pipelined().map(ident, name="p2", parallelism=1)
    p2.write_parquet("out_p", name="out_p", parallelism=1)
    return job


@dataclass
class FakeJob:
    """JobView and JobActions over a real ExecutionState; actions are recorded, not done."""

    state: ExecutionState
    pool: SlotPool
    split_counts: dict[str, int]
    max_concurrent: int = 2
    max_blocked_fraction: float = 0.5
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    # Hosts Spark has executors on whose runners have not connected yet.
    executors: frozenset[str] = frozenset()

    @property
    def hosts(self) -> frozenset[str]:
        return frozenset({*self.pool.hosts, *self.executors})

    def initialize_vertex(
        self,
        name: str,
        parallelism: int,
        inputs: tuple[SubtaskInputs, ...],
        by: str,
        command_id: str,
    ) -> None:
        self.calls.append(("initialize_vertex", name, parallelism, inputs, by, command_id))

    def request_speculative(
        self, task: ExecutionVertexId, command_id: str, count: int, avoid: frozenset[str]
    ) -> None:
        self.calls.append(("request_speculative", task, command_id, count, avoid))

    def block_host(self, host: str, until_ts: int, cause: str, command_id: str) -> None:
        self.calls.append(("block_host", host, until_ts, cause, command_id))

    def unblock_host(self, host: str, command_id: str | None) -> None:
        self.calls.append(("unblock_host", host, command_id))

    def restart_task(self, task: ExecutionVertexId, not_before_ts: int) -> None:
        self.calls.append(("restart_task", task, not_before_ts))

    def fail_job(self, reason: str) -> None:
        self.calls.append(("fail_job", reason))


def attempt(state: ExecutionState, vertex: str, index: int, host: str) -> Attempt:
    subtask = state.subtask(vertex, index)
    assert subtask is not None
    a = Attempt(vertex, index, subtask.next_number(), host, False, None, 0)
    subtask.attempts.append(a)
    return a


@pytest.fixture
def job() -> FakeJob:
    state = ExecutionState(chain(the_job()), 8)
    for name in ("src", "u→out_u", "p1", "p2→out_p"):
        inputs = plans.static_subtask_inputs(
            state, name, SPLITS.get(name, [Split("x", 0, 1)]), wait_for_decider=False
        )
        assert inputs is not None
        parallelism = state.vertices[name].definition.parallelism
        assert parallelism is not None
        state.initialize(name, parallelism, inputs, "fixed")
    # src#0 runs on h1, src#1 has finished, src#2 waits for a slot.
    attempt(state, "src", 0, "h1")
    done = attempt(state, "src", 1, "h2")
    done.status = AttemptStatus.FINISHED
    winner = state.subtask("src", 1)
    assert winner is not None
    winner.winner, winner.available, winner.wanted = done, True, False
    for vertex in ("u→out_u", "p1", "p2→out_p"):
        attempt(state, vertex, 0, "h1")
    pool = SlotPool()
    for host in ("h1", "h2", "h3", "h4"):
        pool.add_host(host, 1)
    return FakeJob(state, pool, dict(SPLIT_COUNTS))


def command(cls: type[r.Command], ts: int = 10, **fields: Any) -> Any:
    return cls(job_id="job", ts=ts, id=f"{cls.__name__}-1", **fields)


def guard(c: r.Command, view: FakeJob) -> str | None:
    handler = handler_for(c)
    assert handler is not None
    return handler.guard(c, view)


def apply(c: r.Command, job: FakeJob, fallback: bool = False) -> list[tuple[Any, ...]]:
    handler = handler_for(c)
    assert handler is not None
    actions: JobActions = job
    handler.apply(c, actions, fallback)
    return job.calls


def rng(name: str, p: tuple[int, int], sp: tuple[int, int] = (0, 0)) -> InputRange:
    return InputRange(name, p[0], p[1], sp[0], sp[1])


def subtasks(*ranges: tuple[InputRange, ...]) -> tuple[SubtaskInputs, ...]:
    return tuple(SubtaskInputs(k, rs) for k, rs in enumerate(ranges))


def test_every_command_type_has_a_handler() -> None:
    # (by name: dataclasses with slots leave their first class object among the subclasses)
    contract = {c.__name__ for c in r.Command.__subclasses__() if c.__module__ == r.__name__}
    assert {c.__name__ for c in HANDLERS} == contract
    assert all(getattr(r, name) in HANDLERS for name in contract)


def test_the_fixture_is_the_job_described() -> None:
    state = ExecutionState(chain(the_job()), 8)
    assert list(state.vertices) == [
        "src",
        "agg",
        "fin→out",
        "f→out_f",
        "a→out_a",
        "u→out_u",
        "p1",
        "p2→out_p",
    ]
    # src writes as many subpartitions as its widest ALL_TO_ALL consumer may read (f: 8).
    assert state.vertices["src"].subpartitions == 8
    assert state.max_parallelism("agg") == 4


# --------------------------------------------------------------------------- SetParallelism

AGG_OK = subtasks((rng("src", (0, 2), (0, 3)),), (rng("src", (0, 2), (4, 7)),))

SET_PARALLELISM_REJECTED = [
    (dict(vertex="nope", parallelism=1, subtask_inputs=()), "unknown vertex 'nope'"),
    (
        dict(vertex="src", parallelism=3, subtask_inputs=()),
        "vertex 'src' is already initialised with parallelism 3",
    ),
    (
        dict(vertex="f→out_f", parallelism=2, subtask_inputs=()),
        "vertex 'f→out_f' has a fixed parallelism of 3",
    ),
    (dict(vertex="agg", parallelism=5, subtask_inputs=()), "parallelism 5 outside bounds [1, 4]"),
    (dict(vertex="agg", parallelism=0, subtask_inputs=()), "parallelism 0 outside bounds [1, 4]"),
    (
        dict(vertex="agg", parallelism=2, subtask_inputs=(AGG_OK[0], AGG_OK[0])),
        "subtask_inputs must name each subtask 0..parallelism-1 exactly once",
    ),
    (
        dict(vertex="agg", parallelism=1, subtask_inputs=subtasks(())),
        "subtask 0: inputs [] != ['src']",
    ),
    (
        dict(vertex="fin→out", parallelism=1, subtask_inputs=subtasks((rng("agg", (0, 0)),))),
        "input 'agg' is not initialised yet",
    ),
    (
        dict(vertex="agg", parallelism=1, subtask_inputs=subtasks((rng("src", (0, 3), (0, 7)),))),
        "subtask 0: src: partition range 0..3 outside 0..2",
    ),
    (
        dict(vertex="agg", parallelism=1, subtask_inputs=subtasks((rng("src", (0, 2), (0, 8)),))),
        "subtask 0: src: subpartition range 0..8 outside 0..7",
    ),
    (
        dict(
            vertex="a→out_a", parallelism=1, subtask_inputs=subtasks((rng(SPLITS_INPUT, (0, 3)),))
        ),
        "subtask 0: split range 0..3 outside 0..2",
    ),
    (
        dict(vertex="a→out_a", parallelism=1, subtask_inputs=subtasks((rng("src", (0, 0)),))),
        "subtask 0: inputs ['src'] != ['@splits']",
    ),
]


@pytest.mark.parametrize(("fields", "reason"), SET_PARALLELISM_REJECTED)
def test_set_parallelism_guard_rejects(job: FakeJob, fields: dict[str, Any], reason: str) -> None:
    assert guard(command(r.SetParallelism, **fields), job) == reason


def test_set_parallelism_guard_accepts_and_apply_initialises(job: FakeJob) -> None:
    ok = command(r.SetParallelism, vertex="agg", parallelism=2, subtask_inputs=AGG_OK)
    assert guard(ok, job) is None
    assert apply(ok, job) == [("initialize_vertex", "agg", 2, AGG_OK, "decider", ok.id)]
    job.calls.clear()
    assert apply(ok, job, fallback=True)[0][4] == "agent-fallback"
    # A source's splits, and a fixed vertex given its own parallelism.
    source = command(
        r.SetParallelism,
        vertex="a→out_a",
        parallelism=2,
        subtask_inputs=subtasks((rng(SPLITS_INPUT, (0, 1)),), (rng(SPLITS_INPUT, (2, 2)),)),
    )
    assert guard(source, job) is None
    fixed = command(
        r.SetParallelism,
        vertex="f→out_f",
        parallelism=3,
        subtask_inputs=tuple(SubtaskInputs(k, (rng("src", (0, 2), (k, k)),)) for k in range(3)),
    )
    assert guard(fixed, job) is None


# --------------------------------------------------------------------------- speculation


def speculate(vertex: str = "src", subtask: int = 0, count: int = 1, **kw: Any) -> Any:
    return command(r.LaunchSpeculativeAttempts, vertex=vertex, subtask=subtask, count=count, **kw)


@pytest.mark.parametrize(
    ("c", "reason"),
    [
        (speculate("nope"), "unknown vertex 'nope'"),
        (speculate("agg"), "vertex 'agg' is not initialised yet"),
        (speculate("src", 5), "unknown subtask src#5 (parallelism 3)"),
        (speculate("src", -1), "unknown subtask src#-1 (parallelism 3)"),
        (speculate(count=0), "count must be at least 1, got 0"),
        (speculate("u→out_u"), "vertex 'u→out_u' is declared unsafe for speculation"),
        (speculate("src", 1), "subtask src#1 already finished"),
        (
            speculate("p1"),
            "subtask p1#0 is in a pipelined region of 2 tasks; "
            "speculation needs a blocking input and output",
        ),
        (speculate("src", 2), "subtask src#2 has no running attempt to mirror"),
        (
            speculate(count=2),
            "1 running + 0 queued + 2 requested attempts exceed max-concurrent-executions 2",
        ),
    ],
)
def test_speculation_guard_rejects(job: FakeJob, c: r.Command, reason: str) -> None:
    assert guard(c, job) == reason


def test_speculation_guard_counts_queued_copies(job: FakeJob) -> None:
    task = ExecutionVertexId("src", 0)
    assert guard(speculate(), job) is None
    job.pool.request(SlotRequest(SpeculativeRequest(task, "earlier", 0), [task]))
    assert guard(speculate(), job) == (
        "1 running + 1 queued + 1 requested attempts exceed max-concurrent-executions 2"
    )
    job.max_concurrent = 3
    assert guard(speculate(), job) is None


def test_speculation_apply_avoids_the_hosts_of_live_attempts(job: FakeJob) -> None:
    c = speculate(avoid_hosts=("h3",))
    assert guard(c, job) is None
    assert apply(c, job) == [
        ("request_speculative", ExecutionVertexId("src", 0), c.id, 1, frozenset({"h1", "h3"}))
    ]


# --------------------------------------------------------------------------- blocking


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        (dict(hosts=(), until_ts=100), "no hosts to block"),
        (dict(hosts=("h1", "hx", "hy"), until_ts=100), "unknown host(s) ['hx', 'hy']"),
        (dict(hosts=("h2",), until_ts=10), "until_ts 10 is not after the command's ts 10"),
    ],
)
def test_block_guard_rejects(job: FakeJob, fields: dict[str, Any], reason: str) -> None:
    job.pool.block("h1", 50)
    assert guard(command(r.BlockNodes, **fields), job) == reason


def test_block_guard_never_blocks_more_than_the_fraction(job: FakeJob) -> None:
    """h1 is blocked already; with 4 hosts and a fraction of 0.5 at most 2 may be."""
    job.pool.block("h1", 50)
    reason = guard(command(r.BlockNodes, hosts=("h2", "h3"), until_ts=100), job)
    assert reason is not None
    assert "would block 3 of 4 hosts" in reason
    assert "blocklist.max-blocked-fraction 0.5" in reason
    job.max_blocked_fraction = 0.75
    assert guard(command(r.BlockNodes, hosts=("h2", "h3"), until_ts=100), job) is None
    # Only hosts the cluster has count: with two of them gone, one block is the limit.
    job.pool.remove_slot("h3/0")
    job.pool.remove_slot("h4/0")
    job.max_blocked_fraction = 0.5
    assert guard(command(r.BlockNodes, hosts=("h2",), until_ts=100), job) is not None


def test_a_host_whose_runners_have_not_connected_may_be_blocked_and_counts_in_the_fraction(
    job: FakeJob,
) -> None:
    """The driver places attempts once its first runner connects: a decision may name a host
    Spark has an executor on before that host's runners join the pool."""
    assert guard(command(r.BlockNodes, hosts=("h5",), until_ts=100), job) == (
        "unknown host(s) ['h5']"
    )
    job.executors = frozenset({"h5", "h6"})
    assert guard(command(r.BlockNodes, hosts=("h5",), until_ts=100), job) is None
    assert guard(command(r.UnblockNodes, hosts=("h6",)), job) is None
    # 6 hosts now: 3 may be blocked at 0.5, not 4.
    assert guard(command(r.BlockNodes, hosts=("h1", "h5", "h6"), until_ts=100), job) is None
    reason = guard(command(r.BlockNodes, hosts=("h1", "h2", "h5", "h6"), until_ts=100), job)
    assert reason is not None and "would block 4 of 6 hosts" in reason


def test_block_guard_accepts_up_to_the_fraction_and_apply_blocks_each_host(job: FakeJob) -> None:
    job.pool.block("h1", 50)
    c = command(r.BlockNodes, hosts=("h2", "h1"), until_ts=100, cause="slow")
    assert guard(c, job) is None  # h1 again: still 2 of 4
    assert apply(c, job) == [
        ("block_host", "h2", 100, "slow", c.id),
        ("block_host", "h1", 100, "slow", c.id),
    ]


def test_unblock_guard_and_apply_only_lifts_blocked_hosts(job: FakeJob) -> None:
    assert guard(command(r.UnblockNodes, hosts=("h1", "hx")), job) == "unknown host(s) ['hx']"
    job.pool.block("h1", 50)
    c = command(r.UnblockNodes, hosts=("h1", "h2"))
    assert guard(c, job) is None
    assert apply(c, job) == [("unblock_host", "h1", c.id)]


# --------------------------------------------------------------------------- failover


@pytest.mark.parametrize(
    ("tasks", "reason"),
    [
        ((), "no tasks to restart"),
        ((r.TaskRef("src", 0), r.TaskRef("nope", 0)), "unknown vertex 'nope'"),
        ((r.TaskRef("agg", 0),), "vertex 'agg' is not initialised yet"),
        ((r.TaskRef("src", 3),), "unknown subtask src#3 (parallelism 3)"),
    ],
)
def test_restart_guard_rejects(job: FakeJob, tasks: tuple[r.TaskRef, ...], reason: str) -> None:
    c = command(r.RestartTasks, tasks=tasks, reason="x", not_before_ts=0)
    assert guard(c, job) == reason


def test_restart_apply_restarts_each_task_not_before_the_given_time(job: FakeJob) -> None:
    c = command(
        r.RestartTasks,
        tasks=(r.TaskRef("src", 1), r.TaskRef("p2→out_p", 0)),
        reason="partition missing",
        not_before_ts=77,
    )
    assert guard(c, job) is None
    assert apply(c, job) == [
        ("restart_task", ExecutionVertexId("src", 1), 77),
        ("restart_task", ExecutionVertexId("p2→out_p", 0), 77),
    ]


def test_fail_job_is_always_accepted(job: FakeJob) -> None:
    c = command(r.FailJob, reason="restart limit reached")
    assert guard(c, job) is None
    assert apply(c, job) == [("fail_job", "restart limit reached")]


# --------------------------------------------------------------------------- the driver


@dataclass(frozen=True)
class Bogus(r.Command):
    """A command type no handler knows."""


@pytest.fixture
def driver(tmp_path: Path):
    h = one_subtask_job(tmp_path).start()
    yield h
    h.stop()


def answers(h: Harness, command_id: str) -> list[tuple[str, str]]:
    """What the driver published about the command: (event type, reason or type)."""
    out = []
    for e in h.publisher.events:
        if isinstance(e, r.CommandApplied) and e.command_id == command_id:
            out.append(("CommandApplied", e.command_type))
        if isinstance(e, r.CommandRejected) and e.command_id == command_id:
            out.append(("CommandRejected", e.reason))
    return out


def test_an_unknown_command_type_is_rejected_and_the_job_goes_on(driver: Harness) -> None:
    driver.command(Bogus(job_id="job", ts=1, id="bogus-1"))
    assert answers(driver, "bogus-1") == [("CommandRejected", "unknown command type Bogus")]
    assert driver.driver.rejected == [("bogus-1", "Bogus", "unknown command type Bogus")]
    assert not driver.finished


def test_a_guard_rejection_is_published_with_its_reason(driver: Harness) -> None:
    driver.command(r.BlockNodes(job_id="job", ts=1, id="b-1", hosts=("nowhere",), until_ts=9))
    assert answers(driver, "b-1") == [("CommandRejected", "unknown host(s) ['nowhere']")]
    assert not driver.driver.pool.blocked()


def test_an_exception_in_apply_becomes_a_rejection_with_its_reason(
    driver: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    def explode(c: r.FailJob, job: JobActions, fallback: bool) -> None:
        raise RuntimeError(f"cannot {c.reason}")

    monkeypatch.setitem(HANDLERS, r.FailJob, Handler(lambda c, view: None, explode))
    driver.command(r.FailJob(job_id="job", ts=1, id="f-1", reason="stop"))
    rejected = [a for a in answers(driver, "f-1") if a[0] == "CommandRejected"]
    assert rejected == [("CommandRejected", "failed while applying: RuntimeError('cannot stop')")]
    assert not driver.finished  # the job goes on
    # ... and still takes commands.
    monkeypatch.undo()
    driver.command(r.FailJob(job_id="job", ts=2, id="f-2", reason="stop"))
    result = driver.result()
    assert result.status == "FAILED" and result.message == "stop"
    assert ("f-1", "FailJob", "failed while applying: RuntimeError('cannot stop')") in (
        result.commands_rejected
    )


def test_an_exception_in_a_guard_becomes_a_rejection(
    driver: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    def trip(c: r.UnblockNodes, view: Any) -> str | None:
        raise KeyError(c.hosts[0])

    monkeypatch.setitem(HANDLERS, r.UnblockNodes, Handler(trip, lambda c, job, fb: None))
    driver.command(r.UnblockNodes(job_id="job", ts=1, id="u-1", hosts=("h1",)))
    assert answers(driver, "u-1") == [("CommandRejected", "invalid command: KeyError('h1')")]
    assert not driver.finished


def test_commands_of_other_jobs_and_repeated_ids_are_ignored(driver: Harness) -> None:
    other = r.BlockNodes(job_id="other", ts=1, id="b-1", hosts=("h1",), until_ts=10**15)
    driver.command(other)
    assert answers(driver, "b-1") == []
    mine = r.UnblockNodes(job_id="job", ts=1, id="u-1", hosts=("h1",))
    driver.command(mine)
    driver.command(mine)
    assert answers(driver, "u-1") == [("CommandApplied", "UnblockNodes")]


def test_the_guard_finds_two_ranges_of_an_input_that_read_one_cell() -> None:
    from tailguard.agent.driver.commands import _overlapping
    from tailguard.model.records import InputRange

    # A split subpartition 3: pieces of partitions 0-499 and 500-999, beside whole ones.
    pieces = [InputRange("L", 0, 499, 3, 3), InputRange("L", 500, 999, 3, 3)]
    assert _overlapping(pieces) is None
    assert _overlapping([*pieces, InputRange("R", 0, 999, 3, 3)]) is None  # another input
    clash = InputRange("L", 400, 999, 2, 4)
    assert _overlapping([*pieces, clash]) == "L partition 400 subpartition 3"
    assert _overlapping([InputRange("L", 0, 9, 0, 1), InputRange("L", 0, 9, 2, 3)]) is None
