"""From execution state to what a task needs, and the driver's side of outputs.

Kept apart from the runner so the mapping of ranges, winners and checksums to a `TaskSpec` can be
tested without a cluster.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from tailguard.agent.driver.slots import ExecutionVertexId
from tailguard.agent.driver.state import Attempt, ExecutionState, Subtask
from tailguard.agent.executor import partitions
from tailguard.agent.executor import sinks as sink_commit
from tailguard.agent.executor.attempt import DEFAULT_BATCH_ROWS, InputPlan, OutputPlan, TaskSpec
from tailguard.agent.executor.sinks import SinkDef, StagedOutput
from tailguard.agent.executor.sources import Split
from tailguard.agent.executor.storage import Storage
from tailguard.agent.graph.chaining import ChainDef
from tailguard.decider.policy import static_subtask_inputs as _static_inputs
from tailguard.decider.policy.assign import InputInfo
from tailguard.decider.policy.decider import waits_for_decider
from tailguard.decider.policy.flink import flink_data_bound
from tailguard.model.config import ConfigError, Settings
from tailguard.model.records import SPLITS_INPUT, InputRange, PartitionRef, SubtaskInputs


def static_subtask_inputs(
    state: ExecutionState,
    name: str,
    splits: list[Split] | None,
    wait_for_decider: bool = True,
) -> tuple[SubtaskInputs, ...] | None:
    """Ranges for a vertex with a fixed parallelism, or None while an input is not initialised
    or while the vertex waits for the decider's byte-balanced ranges.

    Uses the decider's own range rules, so a fixed vertex reads its inputs exactly as an
    adaptive one would at the same parallelism. A fixed vertex whose edges are all blocking
    waits for the decider's byte-balanced ranges (`SetParallelism`, from the service or the
    local fallback, once its inputs have finished: `waits_for_decider`), unless its inputs
    cannot feed that many subtasks at all: then the count-based ranges here name the problem at
    once, rather than the job waiting for a decision the decider declines (`fixed_beyond_data`).
    `wait_for_decider=False` gives the count-based ranges regardless (tools and tests).
    """
    vertex = state.vertices[name]
    parallelism = vertex.definition.parallelism
    assert parallelism is not None
    producers: dict[str, tuple[int, int]] = {}
    for i in vertex.definition.inputs:
        producer = state.vertices[i.producer]
        if not producer.initialized:
            return None
        assert producer.parallelism is not None
        producers[i.producer] = (producer.parallelism, producer.subpartitions)
    if wait_for_decider and _waits(state, vertex.definition):
        infos = [
            InputInfo(i.producer, i.distribution, *producers[i.producer])
            for i in vertex.definition.inputs
        ]
        bound = flink_data_bound(infos)
        if bound is None or parallelism <= bound:
            return None
    split_bytes = tuple(s.bytes for s in splits) if splits is not None else None
    return _static_inputs(
        parallelism=parallelism,
        inputs=[(i.producer, i.distribution) for i in vertex.definition.inputs],
        producers=producers,
        split_bytes=split_bytes,
    )


def _waits(state: ExecutionState, definition: ChainDef) -> bool:
    outputs = [
        state.job.vertices[consumer].inputs[index].exchange
        for consumer, index in state.consumers[definition.name]
    ]
    return waits_for_decider([i.exchange for i in definition.inputs], outputs)


BATCH_SIZE_KEY = "python.fn-execution.arrow.batch.size"


def batch_rows(settings: Settings) -> int:
    """The batch size setting (rows per record batch in an attempt), checked."""
    rows = settings.integer(BATCH_SIZE_KEY)
    if rows < 1:
        raise ConfigError(f"{BATCH_SIZE_KEY}: must be a positive number of rows, got {rows}")
    return rows


def task_spec(
    state: ExecutionState,
    job_id: str,
    storage: Storage,
    subtask: Subtask,
    attempt: int,
    sources: Mapping[str, Sequence[Split]],
    fail_with: str | None,
    together: dict[ExecutionVertexId, int] | None = None,
    rows_per_batch: int = DEFAULT_BATCH_ROWS,
) -> TaskSpec:
    """`sources`: every source vertex's splits (the subtask's own, if a source, and a fused
    producer's: `ExecutionState.fused`). `together` maps the tasks already deployed in the same
    bulk (a pipelined region) to their attempt numbers: an input from one of them reads that
    attempt, once it completes, instead of a winner. `rows_per_batch` is the batch size
    (`batch_rows`)."""
    together = together or {}
    vertex = state.vertices[subtask.vertex]
    definition = vertex.definition
    if definition.source is not None and subtask.vertex not in sources:
        # Without its splits the chain would read nothing and lose the source's rows: a
        # driver bug, which fails the job cleanly rather than the output.
        raise RuntimeError(f"{subtask.vertex}: a source needs its splits")
    chosen_splits = _chosen_splits(subtask, sources.get(subtask.vertex, ()))
    inputs: list[InputPlan] = []
    # A producer's ranges in the order given: one, or a POINTWISE run of up to three.
    by_producer: dict[str, list[InputRange]] = {}
    for rng in subtask.inputs:
        if rng.input != SPLITS_INPUT:
            by_producer.setdefault(rng.input, []).append(rng)
    for i in definition.inputs:
        ranges = by_producer[i.producer]
        producer = state.vertices[i.producer]
        if state.fused(i.producer):
            # Its subtasks' chains, with neither output nor sink: their rows stream into this
            # attempt (numbered as it).
            chains = tuple(
                dataclasses.replace(
                    task_spec(
                        state,
                        job_id,
                        storage,
                        producer.subtasks[p],
                        attempt,
                        sources,
                        None,
                        rows_per_batch=rows_per_batch,
                    ),
                    output=None,
                    input_bytes=None,
                )
                for rng in ranges
                for p in range(rng.partition_start, rng.partition_end + 1)
            )
            inputs.append(InputPlan(tuple(ranges), i.distribution, {}, {}, fused=chains))
            continue
        attempts: dict[int, int] = {}
        checksums: dict[tuple[int, int], str] = {}
        pipelined = False
        for rng in ranges:
            for p in range(rng.partition_start, rng.partition_end + 1):
                if ExecutionVertexId(i.producer, p) in together:
                    attempts[p] = together[ExecutionVertexId(i.producer, p)]
                    pipelined = True
                    continue
                winner = producer.subtasks[p].winner
                if winner is None or winner.outcome is None or not producer.subtasks[p].available:
                    # The scheduler deploys only tasks whose inputs are available; reaching this
                    # is a driver bug, which fails the job cleanly rather than the attempt.
                    raise RuntimeError(
                        f"{subtask.vertex}#{subtask.index}: input {i.producer}#{p} is not available"
                    )
                attempts[p] = winner.number
                for sp in range(rng.subpartition_start, rng.subpartition_end + 1):
                    checksums[(p, sp)] = winner.outcome.checksums[sp]
        inputs.append(InputPlan(tuple(ranges), i.distribution, attempts, checksums, pipelined))
    output = None
    if definition.sink is None:
        distribution, keys = state.output_distribution(definition.name)
        output = OutputPlan(
            distribution, keys, vertex.subpartitions, state.local_aggregation.phase(definition.name)
        )
    return TaskSpec(
        job_id=job_id,
        storage=storage,
        vertex=definition.name,
        subtask=subtask.index,
        attempt=attempt,
        steps=tuple(
            state.local_aggregation.step(
                definition.name, state.broadcast_joins.step(definition.name, s)
            )
            for s in definition.steps
        ),
        source=definition.source,
        splits=chosen_splits,
        inputs=tuple(inputs),
        output=output,
        sink=definition.sink,
        input_bytes=_input_bytes(state, subtask, chosen_splits, together, sources),
        fail_with=fail_with,
        batch_rows=rows_per_batch,
    )


def subtask_input_bytes(
    state: ExecutionState, task: ExecutionVertexId, sources: Mapping[str, Sequence[Split]]
) -> int | None:
    """The bytes `task` is assigned before it is deployed (`sources`: every source vertex's
    splits), for the subtask order (agent/driver/ordering.py); None while a producer has not
    reported."""
    subtask = state.subtask(*task)
    if subtask is None:
        return None
    splits = _chosen_splits(subtask, sources.get(task.vertex, ()))
    return _input_bytes(state, subtask, splits, {}, sources)


def _chosen_splits(subtask: Subtask, splits: Sequence[Split]) -> tuple[Split, ...]:
    """The source splits `subtask`'s ranges pick out of its vertex's `splits`."""
    return tuple(
        split
        for rng in subtask.inputs
        if rng.input == SPLITS_INPUT
        for split in splits[rng.partition_start : rng.partition_end + 1]
    )


def _input_bytes(
    state: ExecutionState,
    subtask: Subtask,
    splits: tuple[Split, ...],
    together: dict[ExecutionVertexId, int],
    sources: Mapping[str, Sequence[Split]],
) -> int | None:
    """The bytes the attempt is assigned, from the producers' reported subpartition sizes (for
    progress), and a fused producer's source splits; None when a producer deployed with it has
    not reported yet."""
    total = sum(s.bytes for s in splits)
    for rng in subtask.inputs:
        if rng.input == SPLITS_INPUT:
            continue
        producer = state.vertices[rng.input]
        fused = state.fused(rng.input)
        for p in range(rng.partition_start, rng.partition_end + 1):
            if fused:
                chosen = _chosen_splits(producer.subtasks[p], sources.get(rng.input, ()))
                total += sum(s.bytes for s in chosen)
                continue
            if ExecutionVertexId(rng.input, p) in together:
                return None
            winner = producer.subtasks[p].winner
            if winner is None or winner.outcome is None:
                return None
            sizes = winner.outcome.bytes_per_subpartition
            total += sum(sizes[rng.subpartition_start : rng.subpartition_end + 1])
    return total


def commit(storage: Storage, sink: SinkDef, staged: StagedOutput) -> None:
    sink_commit.commit_sink_output(storage, staged, sink.path)


def prepare_sink(sink: SinkDef) -> None:
    sink_commit.prepare_sink(sink.path)


def finalize_sink(storage: Storage, sink: SinkDef) -> None:
    sink_commit.finalize_sink(sink.path)


def discard(storage: Storage, job_id: str, definition: ChainDef, attempt: Attempt) -> None:
    """Remove what a losing or cancelled attempt wrote (it may still be writing: best effort;
    the job's release at the end sweeps the rest)."""
    outcome = attempt.outcome
    if definition.sink is not None:
        if outcome is not None and outcome.staged is not None:
            sink_commit.abort_staged(storage, outcome.staged)
        return
    partitions.release_partition(
        storage, job_id, PartitionRef(attempt.vertex, attempt.subtask, attempt.number)
    )


def release_job(storage: Storage, job_id: str) -> None:
    partitions.sweep_job(storage, job_id)
