"""Properties of the failover core over generated histories."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from failover_history import AgentSim
from hypothesis import given, settings
from hypothesis import strategies as st
from test_failover_policy import FLIP1_JOB, reads
from tests.examples_budget import examples

from tailguard.failover.policy import FailoverStrategy
from tailguard.model.config import Settings
from tailguard.model.ids import derived_id
from tailguard.model.records import (
    AttemptFailed,
    CancelReason,
    Distribution,
    EdgeSpec,
    ErrorKind,
    Exchange,
    FailJob,
    JobGraphSpec,
    PartitionRef,
    Record,
    RestartTasks,
    SubtaskInputs,
    TaskRef,
    VertexKind,
    VertexSpec,
)
from tailguard.model.topology import ExecutionTopology, JobGraph

_OPS = ("deploy", "rerun", "finish", "fail", "fail-partition", "release", "cancel", "apply")


@st.composite
def histories(draw: st.DrawFn) -> AgentSim:
    count = draw(st.integers(1, 4))
    names = [f"V{k}" for k in range(count)]
    edges = []
    for target in range(1, count):
        for index, source in enumerate(
            sorted(draw(st.sets(st.integers(0, target - 1), max_size=2)))
        ):
            edges.append(
                EdgeSpec(
                    names[source],
                    names[target],
                    draw(st.sampled_from(list(Distribution))),
                    draw(st.sampled_from(list(Exchange))),
                    index,
                )
            )
    graph = JobGraphSpec(tuple(VertexSpec(n, VertexKind.OPERATOR) for n in names), tuple(edges))
    config = {
        "failover.restart-consumers": draw(st.sampled_from(["always", "unless-checksum-matches"])),
        "restart-strategy.type": "fixed-delay",
        "restart-strategy.fixed-delay.attempts": str(draw(st.integers(0, 6))),
    }
    sim = AgentSim(graph, config=config)
    parallelism = {n: draw(st.integers(1, 3)) for n in names}
    for name in JobGraph(graph).order:
        sim.init(name, parallelism[name])
    topology = ExecutionTopology(JobGraph(graph), parallelism)
    tasks = [(n, k) for n in JobGraph(graph).order for k in range(parallelism[n])]
    # A prefix of the tasks ran in topological order, the next few are running: so that
    # consumers have read partitions that the random failures below can take away.
    ran = draw(st.integers(len(tasks) // 2, len(tasks)))
    for vertex, subtask in tasks[:ran]:
        sim.run(vertex, subtask, (draw(st.sampled_from(["x", "y"])),))
    for vertex, subtask in tasks[ran : ran + draw(st.integers(0, 3))]:
        sim.deploy(vertex, subtask)
    pending: list[RestartTasks] = []
    for _ in range(draw(st.integers(0, 40))):
        op = draw(st.sampled_from(_OPS))
        running = [t for t in tasks if sim.live.get(t)]
        needs_live = op in ("finish", "fail", "fail-partition", "cancel")
        vertex, subtask = draw(st.sampled_from(running if needs_live and running else tasks))
        live = sorted(sim.live.get((vertex, subtask), set()))
        before = len(sim.outputs)
        if op == "deploy":
            sim.deploy(vertex, subtask, speculative=bool(live))
        elif op == "rerun":
            sim.run(vertex, subtask, (draw(st.sampled_from(["x", "y"])),))
        elif op == "apply" and pending:
            sim.apply(pending.pop(0))
        elif op in ("finish", "fail", "fail-partition", "cancel") and live:
            attempt = draw(st.sampled_from(live))
            if op == "finish":
                checksum = draw(st.sampled_from(["x", "y"]))
                sim.finish(vertex, subtask, attempt, (checksum,))
            elif op == "cancel":
                sim.cancel(vertex, subtask, attempt, CancelReason.LOST_RACE)
            elif op == "fail":
                sim.fail(vertex, subtask, attempt)
            else:
                producers = topology.producers_of(vertex, subtask) or (TaskRef(vertex, subtask),)
                producer = draw(st.sampled_from(producers))
                attempt_no = draw(st.sampled_from([0, 0, 0, 1]))
                missing = PartitionRef(producer.vertex, producer.subtask, attempt_no)
                sim.fail(vertex, subtask, attempt, ErrorKind.PARTITION_MISSING, missing)
        elif op == "release":
            sim.release(vertex, subtask, draw(st.integers(0, 1)))
        pending.extend(o for o in sim.outputs[before:] if isinstance(o, RestartTasks))
    return sim


def _reference_region(topology: ExecutionTopology, task: TaskRef) -> set[TaskRef]:
    """The pipelined component of `task`, by plain search over pipelined execution edges."""
    neighbours: dict[TaskRef, set[TaskRef]] = {t: set() for t in topology.tasks()}
    for t in topology.tasks():
        for spec, producers in topology.input_producers(t.vertex, t.subtask):
            if spec.exchange is Exchange.PIPELINED:
                for j in producers:
                    neighbours[t].add(TaskRef(spec.source, j))
                    neighbours[TaskRef(spec.source, j)].add(t)
    component, stack = set(), [task]
    while stack:
        current = stack.pop()
        if current not in component:
            component.add(current)
            stack.extend(neighbours[current])
    return component


@settings(max_examples=examples(200), deadline=None)
@given(histories())
def test_a_restart_always_contains_the_failed_tasks_region(sim: AgentSim) -> None:
    topology = ExecutionTopology(
        JobGraph(sim.graph),
        {e.vertex: e.parallelism for e in sim.events if hasattr(e, "parallelism")},
    )
    by_id = {o.id: o for o in sim.outputs}
    for event in sim.events:
        if not isinstance(event, AttemptFailed):
            continue
        command = by_id.get(derived_id("failover", event.id, "restart"))
        if isinstance(command, RestartTasks):
            failed = TaskRef(event.vertex, event.subtask)
            assert _reference_region(topology, failed) <= set(command.tasks)
            assert command.not_before_ts >= event.ts


@settings(max_examples=examples(200), deadline=None)
@given(histories())
def test_outputs_are_well_formed(sim: AgentSim) -> None:
    ids = [o.id for o in sim.outputs]
    assert len(ids) == len(set(ids))
    failed_at = None
    for index, out in enumerate(sim.outputs):
        assert out.job_id == sim.job_id
        if isinstance(out, RestartTasks):
            assert out.tasks and len(set(out.tasks)) == len(out.tasks)
        if isinstance(out, FailJob):
            failed_at = index
    if failed_at is not None:
        assert failed_at == len(sim.outputs) - 1, "nothing after FailJob"


@settings(max_examples=examples(200), deadline=None)
@given(histories())
def test_replaying_the_events_gives_the_same_outputs(sim: AgentSim) -> None:
    replay = FailoverStrategy(Settings())
    outputs: list[Record] = []
    for event in sim.events:
        outputs.extend(replay.handle(event))
    assert outputs == sim.outputs


_SCENARIO = """
import json, sys
sys.path.insert(0, sys.argv[1])
from test_failover_policy import flip1_running
from tailguard.model.records import ErrorKind, PartitionRef
sim = flip1_running()
sim.release("A", 0, 0)
out = sim.fail("C", 0, 0, ErrorKind.PARTITION_MISSING, PartitionRef("B", 0, 0))
sim.apply(out[0])
for v, k in (("A", 0), ("B", 0), ("C", 1), ("D", 0)):
    sim.fail(v, k, sim.deploy(v, k))
print(json.dumps([repr(o) for o in sim.outputs]))
"""


def test_outputs_do_not_depend_on_string_hashing() -> None:
    here = Path(__file__).parent
    results = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", _SCENARIO, str(here)],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        results.append(json.loads(done.stdout))
    assert results[0] == results[1]
    assert len(results[0]) >= 2


_CHECKSUM = st.sampled_from(["x", "y"])


@settings(max_examples=examples(150), deadline=None)
@given(
    old=st.tuples(_CHECKSUM, _CHECKSUM, _CHECKSUM, _CHECKSUM),
    new=st.tuples(_CHECKSUM, _CHECKSUM, _CHECKSUM, _CHECKSUM),
    bounds=st.tuples(st.integers(0, 3), st.integers(0, 3)).map(sorted),
    d_finished=st.booleans(),
)
def test_a_read_consumer_restarts_exactly_when_what_it_read_changed(
    old: tuple[str, ...], new: tuple[str, ...], bounds: list[int], d_finished: bool
) -> None:
    """FLIP-1's A-B-C-D job with C1 losing its subpartition (0) of B: D, reading `bounds`,
    restarts at once if it is running on lost data, otherwise exactly when B's re-produced
    checksums differ on the subpartitions D read."""
    start, end = bounds
    sim = AgentSim(FLIP1_JOB)
    sim.init("A", 1)
    sim.run("A", 0)
    sim.init("B", 1)
    sim.run("B", 0, old)
    sim.init("C", 2, tuple(SubtaskInputs(k, (reads("B", (k, k)),)) for k in range(2)))
    sim.init("S", 1)
    sim.init("D", 1, (SubtaskInputs(0, (reads("B", (start, end)),)),))
    for vertex, subtask in (("C", 0), ("C", 1), ("S", 0), ("D", 0)):
        sim.deploy(vertex, subtask)
    if d_finished:
        sim.finish("D", 0, 0)
    out = sim.fail("C", 0, 0, ErrorKind.PARTITION_MISSING, PartitionRef("B", 0, 0))
    (restart,) = out
    assert isinstance(restart, RestartTasks)
    lost = not d_finished and start == 0
    assert (TaskRef("D", 0) in restart.tasks) == lost
    sim.apply(restart)
    later = sim.finish("B", 0, sim.deploy("B", 0), new)
    changed = old[start : end + 1] != new[start : end + 1]
    expected = [] if lost or not changed else [(TaskRef("D", 0),)]
    assert [o.tasks for o in later if isinstance(o, RestartTasks)] == expected
