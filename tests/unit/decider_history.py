"""Builders and a small agent simulator for the decider tests.

The simulator plays the agent's part of FLIP-187's loop: it applies each `SetParallelism` by
emitting `VertexInitialized`, initialises fixed vertices itself with `static_subtask_inputs`
once their producers are initialised, and finishes every subtask with the bytes a callback
chooses, each producer writing the largest max parallelism among its ALL_TO_ALL and POINTWISE
consumers subpartitions, else 1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tailguard.decider.policy import ParallelismDecider, static_subtask_inputs
from tailguard.model import records as r
from tailguard.model.config import Settings
from tailguard.model.records import Distribution, VertexKind

JOB = "job-1"
MAXP_KEY = "execution.batch.adaptive.auto-parallelism.max-parallelism"
# Producers hash-partition for ALL_TO_ALL consumers and, as Flink's dynamic graphs do, write
# several subpartitions for POINTWISE ones too, so a POINTWISE consumer can have more subtasks
# than its producer has partitions.
SLICED = (Distribution.ALL_TO_ALL, Distribution.POINTWISE)


def source(name: str, splits: tuple[int, ...], **kw: object) -> r.VertexSpec:
    return r.VertexSpec(name, VertexKind.SOURCE, split_bytes=splits, **kw)  # type: ignore[arg-type]


def op(name: str, **kw: object) -> r.VertexSpec:
    return r.VertexSpec(name, VertexKind.OPERATOR, **kw)  # type: ignore[arg-type]


def edge(src: str, dst: str, dist: Distribution, index: int = 0) -> r.EdgeSpec:
    return r.EdgeSpec(src, dst, dist, index=index)


def vol(nbytes: int) -> dict[str, str]:
    return {"execution.batch.adaptive.auto-parallelism.avg-data-volume-per-task": f"{nbytes} b"}


# Producer name, consumer subtask count, producer subtask -> bytes per subpartition.
BytesFn = Callable[[str, int, int], tuple[int, ...]]


@dataclass
class Sim:
    vertices: list[r.VertexSpec]
    edges: list[r.EdgeSpec]
    config: dict[str, str] = field(default_factory=dict)
    decider: ParallelismDecider | None = None
    seq: int = 0
    log: list[r.Record] = field(default_factory=list)
    decisions: dict[str, r.SetParallelism] = field(default_factory=dict)
    initialized: dict[str, r.VertexInitialized] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.decider is None:
            self.decider = ParallelismDecider(Settings())

    # ---------------------------------------------------------------- events

    def feed(self, cls: type[r.Event], **fields: object) -> list[r.Record]:
        self.seq += 1
        event = cls(job_id=JOB, ts=1000 + self.seq, id=f"{JOB}-e{self.seq}", **fields)
        self.log.append(event)
        assert self.decider is not None
        out = self.decider.handle(event)
        self.log.extend(out)
        for command in out:
            assert isinstance(command, r.SetParallelism)
            assert command.vertex not in self.decisions, "one decision per vertex"
            self.decisions[command.vertex] = command
        return out

    def submit(self) -> list[r.Record]:
        graph = r.JobGraphSpec(tuple(self.vertices), tuple(self.edges))
        return self.feed(r.JobSubmitted, name="j", graph=graph, config=dict(self.config))

    def initialize(
        self, vertex: str, parallelism: int, inputs: tuple[r.SubtaskInputs, ...] = ()
    ) -> list[r.Record]:
        out = self.feed(
            r.VertexInitialized,
            vertex=vertex,
            parallelism=parallelism,
            subtask_inputs=inputs,
            decided_by="test",
        )
        self.initialized[vertex] = self.log[-1 - len(out)]  # type: ignore[assignment]
        return out

    def finish(
        self, vertex: str, subtask: int, sizes: tuple[int, ...], attempt: int = 0
    ) -> list[r.Record]:
        return self.feed(
            r.AttemptFinished,
            vertex=vertex,
            subtask=subtask,
            attempt=attempt,
            host="h1",
            input_bytes=None,
            records=0,
            bytes_per_subpartition=sizes,
            checksums=tuple("x" for _ in sizes),
        )

    # ---------------------------------------------------------------- graph facts

    def spec(self, name: str) -> r.VertexSpec:
        return next(v for v in self.vertices if v.name == name)

    def inputs(self, name: str) -> list[r.EdgeSpec]:
        return sorted((e for e in self.edges if e.target == name), key=lambda e: e.index)

    def max_parallelism(self, name: str) -> int:
        default = int(Settings(self.config).integer(MAXP_KEY))
        return self.spec(name).max_parallelism or default

    def subpartitions(self, producer: str) -> int:
        counts = [1] + [
            self.max_parallelism(e.target)
            for e in self.edges
            if e.source == producer and e.distribution in SLICED
        ]
        return max(counts)

    # ---------------------------------------------------------------- the agent's loop

    def run(self, sizes: BytesFn) -> None:
        """Submit, then initialise and finish vertices until nothing more happens."""
        self.submit()
        progress = True
        while progress:
            progress = False
            for v in self.vertices:
                if v.name in self.initialized:
                    continue
                if v.name in self.decisions:
                    d = self.decisions[v.name]
                    self._initialize_and_run(v.name, d.parallelism, d.subtask_inputs, sizes)
                    progress = True
                elif v.parallelism is not None and all(
                    e.source in self.initialized for e in self.inputs(v.name)
                ):
                    producers = {
                        e.source: (
                            self.initialized[e.source].parallelism,
                            self.subpartitions(e.source),
                        )
                        for e in self.inputs(v.name)
                    }
                    ranges = static_subtask_inputs(
                        v.parallelism,
                        [(e.source, e.distribution) for e in self.inputs(v.name)],
                        producers,
                        v.split_bytes if not self.inputs(v.name) else None,
                    )
                    self._initialize_and_run(v.name, v.parallelism, ranges, sizes)
                    progress = True

    def _initialize_and_run(
        self,
        name: str,
        parallelism: int,
        inputs: tuple[r.SubtaskInputs, ...],
        sizes: BytesFn,
    ) -> None:
        self.initialize(name, parallelism, inputs)
        nsub = self.subpartitions(name)
        for k in range(parallelism):
            produced = sizes(name, nsub, k)
            assert len(produced) == nsub
            self.finish(name, k, produced)
