"""Synthetic job logs for the inspect tests: records with the fields that matter, the rest
defaulted. The recorded demo archive (`recorded/demo-speculation.avro`) is the real history."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tailguard.model import records as r

START = 1_700_000_000_000
# `make demo` on 2026-11-23 (3 workers, 127.0.0.4 throttled 5x, services on): the detector
# flagged sales→score→partial#2.0, the speculator launched #2.1 on 127.0.0.2, which won, and
# the blocklist blocked 127.0.0.4 until after the job's end.
DEMO_ARCHIVE = Path(__file__).parent / "recorded" / "demo-speculation.avro"
DEMO_LAUNCH = "speculator-5c0e5e33c85f92f0873e3843"
DEMO_FINDING = "detector-6f1929a9d26e42dfd72e2eb9"
DEMO_TICK = "sales-by-region-20261123-193606-05a344-e87"
DEMO_HEAD = "sales→score→partial"

GRAPH = r.JobGraphSpec(
    vertices=(
        r.VertexSpec("src", r.VertexKind.SOURCE, operators=("read", "parse")),
        r.VertexSpec("sink", r.VertexKind.SINK),
    ),
    edges=(r.EdgeSpec("src", "sink", r.Distribution.ALL_TO_ALL),),
)


class JobLog:
    """Appends records of one job; `at` is milliseconds after the job's start."""

    def __init__(self, job_id: str = "job-1") -> None:
        self.job_id = job_id
        self.records: list[r.Record] = []

    def add(self, cls: type[r.Record], at: int, record_id: str | None = None, **fields: Any) -> Any:
        record_id = record_id or f"{self.job_id}-e{len(self.records) + 1}"
        record = cls(job_id=self.job_id, ts=START + at, id=record_id, **fields)
        self.records.append(record)
        return record

    def submitted(self, config: dict[str, str] | None = None) -> r.JobSubmitted:
        submitted: r.JobSubmitted = self.add(
            r.JobSubmitted, 0, name="job", graph=GRAPH, config=config or {}
        )
        return submitted

    def initialized(self, at: int, vertex: str, parallelism: int) -> r.VertexInitialized:
        initialized: r.VertexInitialized = self.add(
            r.VertexInitialized,
            at,
            vertex=vertex,
            parallelism=parallelism,
            subtask_inputs=(),
            decided_by="fixed",
        )
        return initialized

    def attempt(
        self,
        cls: type[r.Record],
        at: int,
        vertex: str,
        subtask: int,
        attempt: int,
        host: str,
        **fields: Any,
    ) -> Any:
        """An event of one attempt (deploying, progress, finished, failed, cancelled)."""
        key = {"vertex": vertex, "subtask": subtask, "attempt": attempt, "host": host}
        return self.add(cls, at, **key, **fields)

    def deploy(self, at: int, vertex: str, subtask: int, attempt: int, host: str, **f: Any) -> Any:
        return self.attempt(r.AttemptDeploying, at, vertex, subtask, attempt, host, **f)

    def finish(self, at: int, vertex: str, subtask: int, attempt: int, host: str) -> Any:
        return self.attempt(
            r.AttemptFinished,
            at,
            vertex,
            subtask,
            attempt,
            host,
            input_bytes=1000,
            records=10,
            bytes_per_subpartition=(300, 200),
            checksums=("a", "b"),
        )
