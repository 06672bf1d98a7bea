"""Vertex initialisation: a vertex gets its parallelism and each subtask its input ranges,
from its fixed parallelism once its inputs are initialised, or from `SetParallelism`."""

from __future__ import annotations

from tailguard.agent.driver import plans
from tailguard.agent.driver.context import JobContext
from tailguard.model import records as r


class VertexInitializer:
    def __init__(self, ctx: JobContext) -> None:
        self._ctx = ctx

    def initialize_static(self) -> None:
        """Vertices with a fixed parallelism are initialised as soon as their inputs are;
        adaptive ones wait for SetParallelism (from the decider, or the local fallback)."""
        state = self._ctx.state
        progress = True
        while progress:
            progress = False
            for name in state.vertices:
                vertex = state.vertices[name]
                if vertex.initialized or vertex.definition.parallelism is None:
                    continue
                inputs = plans.static_subtask_inputs(state, name, self._ctx.splits.get(name))
                if inputs is None:
                    continue
                self.initialize(name, vertex.definition.parallelism, inputs, "fixed", None)
                progress = True

    def initialize(
        self,
        name: str,
        parallelism: int,
        inputs: tuple[r.SubtaskInputs, ...],
        by: str,
        command_id: str | None,
    ) -> None:
        self._ctx.state.initialize(name, parallelism, inputs, by)
        self._ctx.events.emit(
            r.VertexInitialized,
            vertex=name,
            parallelism=parallelism,
            subtask_inputs=inputs,
            decided_by=by,
            command_id=command_id,
        )
        self.initialize_static()
