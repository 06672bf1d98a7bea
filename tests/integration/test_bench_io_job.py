"""The benchmarks' I/O job as a tailguard graph, in several stages (`IoSize.stages`).

`make bench-fleet` runs it in two stages so that a slow node gets a task in each: the waits
must happen once per stage, at the source's parallelism, and the sums stay exact.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tailguard.bench.runner import IO_VERTEX, tailguard_job
from tailguard.bench.scenarios import IO_JOB_SETTINGS, QUICK, IoSize, policy_for
from tailguard.examples import sales_by_region as example
from tailguard.testing import run_job

pytestmark = pytest.mark.spark
FILES = 3  # two row groups each: 6 splits


@pytest.mark.parametrize("stages", [1, 2, 3])
def test_the_io_job_waits_once_per_stage_at_the_source_parallelism(
    tailguard_spark: Any, tmp_path: Path, stages: int
) -> None:
    # The bench's split size and policy: one source subtask per split.
    data = example.generate(tmp_path / "sales", files=FILES, rows_per_file=12_000)
    io = IoSize(files=FILES, rows_per_file=12_000, task_s=0.01, workers=2, stages=stages)
    output = tmp_path / "out"
    job = tailguard_job("io", data, output, 0, io)
    # As the bench runs it: batch by batch, six batches per split.
    settings = {**policy_for(QUICK, io), **IO_JOB_SETTINGS}
    run = run_job(job, tailguard_spark, tmp_path, settings=settings)
    assert run.ok, run.result.message

    expected = example.reference(data)
    actual = example.read_output(output)
    assert expected.equals(actual[expected.columns.tolist()])
    waits = [IO_VERTEX] + [f"{IO_VERTEX}-{k}" for k in range(1, stages)]
    assert set(waits) <= set(run.job.vertices)
    # Every stage that waits has one subtask per split, each finished once.
    for vertex in waits:
        done = sorted(a.subtask for a in run.attempts(vertex) if a.status == "FINISHED")
        assert done == list(range(io.tasks)), vertex
