"""Peak memory of the Python worker that runs an attempt: streamed vs whole-partition
(`make bench-memory`).

    .venv/bin/python benchmarks/memory.py [--batch-rows 250000] [--batches 10,40]
        [--work-dir work/bench-memory]

One subtask reads a Parquet file of N row groups of `--batch-rows` rows (its input is N times
the batch size, for each N of `--batches`), runs two operators and writes a Parquet sink, on Spark
`local[1]` (one slot runner, so one Python worker runs every attempt) through the public entry
`tailguard.run`, without services. Two contenders, each in a fresh process (a fresh Spark and
fresh Python workers):

- streamed: `map_batches(enrich).map_batches(flag)` with `python.fn-execution.arrow.batch.size`
  = `--batch-rows`: the attempt holds a few batches;
- whole: `map(lambda t: flag(enrich(t)))`, today's whole-partition execution: the attempt
  holds its whole input (and the operators' copies of it);
- join: the input left-joined on `id` with a second read of it (`id` and `a` as `a2`), its
  build side, the whole input, far above the join's `memory=` bound of batch x depth: the
  build side spills (`spilled_bytes` is printed), the probe side streams.

What is measured, per Python worker process of the Spark session (the children of the
`pyspark.daemon`, found under this process in /proc): the kernel's exact peak resident set
(`VmHWM` in /proc/PID/status, no sampling to miss a spike). A warm-up job with one small batch
runs first in the same session; its peak is the worker's baseline (interpreter, pyarrow,
pandas, the runner, a tiny attempt). Then the peak is reset (`5` to /proc/PID/clear_refs) and
the measured job runs. The batch-size bound is the bytes of one input batch times the chain's
depth (source, two operators, sink: 4); the join's `memory=` is the same bound. Printed per run:
the worker's peak against (baseline + bound) — the claim checked, for the streamed and the join
runs at the first input size, is peak ≤ 2 × (baseline + bound), the exit status says whether it
holds — and the peak's growth
over the baseline against the bound alone, the stricter reading. Two input sizes show what
grows with the input and what does not. The machine's load
is printed before and after (other processes share the cores; memory is not timing, so load
matters less here than in the other benchmarks). Linux only (/proc).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tailguard.cluster import procs

DEPTH = 4  # source, enrich, flag, sink: the stages that each hold a batch


def enrich(batch: Any) -> Any:
    """s = a + b (one more int64 column)."""
    return batch.append_column("s", pc.add(batch["a"], batch["b"]))


def flag(batch: Any) -> Any:
    """y = x * 2 (one more float64 column)."""
    return batch.append_column("y", pc.multiply(batch["x"], 2.0))


def whole(table: pa.Table) -> pa.Table:
    return flag(enrich(table))


def generate(path: Path, batches: int, batch_rows: int) -> int:
    """The input: `batches` row groups of `batch_rows` rows, 40 bytes a row; returns the Arrow
    bytes of one batch."""
    if path.exists() and pq.ParquetFile(path).metadata.num_rows == batches * batch_rows:
        return _batch_bytes(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(11)
    with pq.ParquetWriter(path, _schema(), compression="zstd") as writer:
        for index in range(batches):
            start = index * batch_rows
            writer.write_table(
                pa.table(
                    {
                        "id": np.arange(start, start + batch_rows, dtype=np.int64),
                        "k": rng.integers(0, 1_000, size=batch_rows, dtype=np.int64),
                        "a": rng.integers(0, 1 << 40, size=batch_rows, dtype=np.int64),
                        "b": rng.integers(0, 1 << 40, size=batch_rows, dtype=np.int64),
                        "x": rng.random(batch_rows),
                    },
                    schema=_schema(),
                ),
                row_group_size=batch_rows,
            )
    return _batch_bytes(path)


def _schema() -> pa.Schema:
    return pa.schema(
        [
            ("id", pa.int64()),
            ("k", pa.int64()),
            ("a", pa.int64()),
            ("b", pa.int64()),
            ("x", pa.float64()),
        ]
    )


def _batch_bytes(path: Path) -> int:
    return int(pq.ParquetFile(path).read_row_group(0).nbytes)


# ---------------------------------------------------------------------------- /proc


def python_workers() -> list[int]:
    """The Python worker processes under this process: the forks of a `pyspark.daemon` (a
    process running it whose parent runs it too)."""
    parents = procs.parent_map()
    return sorted(
        pid
        for pid in procs.descendants(os.getpid(), parents)[1:]
        if "pyspark.daemon" in procs.cmdline(pid)
        and "pyspark.daemon" in procs.cmdline(parents[pid])
    )


def _status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def peak_bytes(pid: int) -> int:
    return _status_kib(pid, "VmHWM") * 1024


def reset_peak(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident set


# ---------------------------------------------------------------------------- one contender


def measure(mode: str, data: Path, warm: Path, work: Path, batch_rows: int) -> dict[str, Any]:
    from tailguard.agent.adapters.spark import session_builder
    from tailguard.agent.driver.result import RunResult
    from tailguard.agent.entry import run
    from tailguard.agent.graph.api import Job
    from tailguard.model.config import Settings

    def job(source: Path, name: str) -> Job:
        out = work / "out" / f"{mode}-{name}"
        graph = Job(f"memory-{mode}-{name}")
        read = graph.read_parquet(str(source), name="source", parallelism=1)
        if mode == "streamed":
            done = read.map_batches(enrich, name="enrich").map_batches(flag, name="flag")
        elif mode == "join":
            dims = graph.read_parquet(str(source), name="dims", parallelism=1)
            build = dims.select("id", ("a2", pc.field("a")), name="dim")
            memory = _batch_bytes(source) * DEPTH
            done = read.join(build, "id", "left", memory=memory, name="join", parallelism=1)
        else:
            done = read.map(whole, name="whole")
        done.write_parquet(str(out), name="sink")
        return graph

    settings = Settings(
        {
            "python.fn-execution.arrow.batch.size": str(batch_rows),
            "tailguard.work-dir": str(work / mode),
            "tailguard.archive-dir": str(work / mode / "archive"),
        }
    )
    spark = session_builder("local[1]", app_name=f"bench-memory-{mode}").getOrCreate()
    try:

        def run_job(source: Path, name: str) -> RunResult:
            result = run(
                job(source, name),
                spark,
                log_mode="archive",
                services=False,
                settings=settings,
                progress=False,
            )
            assert result.ok, result.summary()
            return result

        run_job(warm, "warm-up")
        baseline = {pid: peak_bytes(pid) for pid in python_workers()}
        for pid in baseline:
            reset_peak(pid)
        started = time.monotonic()
        measured = run_job(data, "measured")
        seconds = time.monotonic() - started
        peaks = {pid: peak_bytes(pid) for pid in python_workers()}
    finally:
        spark.stop()
    # The worker that ran the measured attempt is the one whose peak grew most.
    pid = max(peaks, key=lambda p: peaks[p] - baseline.get(p, 0))
    return {
        "mode": mode,
        "workers": len(peaks),
        "pid": pid,
        "baseline_bytes": baseline.get(pid, 0),
        "peak_bytes": peaks[pid],
        "seconds": round(seconds, 2),
        "spilled_bytes": sum(a.spilled_bytes for a in measured.attempts if a.won),
    }


# ---------------------------------------------------------------------------- the driver


def _mib(n: float) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def _contender(mode: str, args: argparse.Namespace, batches: int, work: Path) -> dict[str, Any]:
    child = subprocess.run(
        [
            sys.executable,
            __file__,
            "--measure",
            mode,
            "--batch-rows",
            str(args.batch_rows),
            "--input-batches",
            str(batches),
            "--work-dir",
            str(work),
        ],
        capture_output=True,
        text=True,
    )
    if child.returncode != 0:
        sys.stderr.write(child.stderr[-5_000:])
        raise SystemExit(f"the {mode} run failed (exit {child.returncode})")
    figures: dict[str, Any] = json.loads(child.stdout.strip().splitlines()[-1])
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-rows", type=int, default=250_000)
    parser.add_argument(
        "--batches",
        default="10,40",
        help="input sizes in batches, comma-separated; the first is the claim's (default 10,40)",
    )
    parser.add_argument("--work-dir", type=Path, default=Path("work") / "bench-memory")
    parser.add_argument("--measure", choices=["streamed", "whole", "join"], help=argparse.SUPPRESS)
    parser.add_argument("--input-batches", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    work: Path = args.work_dir.resolve()
    warm = work / "data" / "warm.parquet"
    if args.measure:
        data = work / "data" / f"input-{args.input_batches}.parquet"
        print(json.dumps(measure(args.measure, data, warm, work, args.batch_rows)))
        return 0

    command = shlex.join([sys.executable, *sys.argv])
    sizes = [int(n) for n in str(args.batches).split(",")]
    generate(warm, 1, 1_000)
    load_before = os.getloadavg()
    runs: list[dict[str, Any]] = []
    batch_bytes = 0
    for batches in sizes:
        batch_bytes = generate(work / "data" / f"input-{batches}.parquet", batches, args.batch_rows)
        for mode in ("streamed", "whole", "join"):
            runs.append({"batches": batches, **_contender(mode, args, batches, work)})
    load_after = os.getloadavg()
    bound = batch_bytes * DEPTH

    print(f"command: {command}")
    print(
        f"load average (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f}; "
        f"{os.cpu_count()} cores"
    )
    print(
        f"one batch: {args.batch_rows} rows = {_mib(batch_bytes)} in Arrow; "
        f"bound = batch x depth {DEPTH} = {_mib(bound)}"
    )
    for run in runs:
        growth = run["peak_bytes"] - run["baseline_bytes"]
        whole_bound = run["baseline_bytes"] + bound
        print(
            f"input {run['batches']:>3} batches ({_mib(batch_bytes * run['batches'])}), "
            f"{run['mode']:>8}: worker peak RSS {_mib(run['peak_bytes'])} = "
            f"{run['peak_bytes'] / whole_bound:.2f} x (baseline + bound); growth over the "
            f"baseline {_mib(run['baseline_bytes'])}: {_mib(growth)} = "
            f"{growth / bound:.2f} x bound; job {run['seconds']} s"
            + (f"; spilled {_mib(run['spilled_bytes'])}" if run["spilled_bytes"] else "")
        )
    within = True
    for mode in ("streamed", "join"):
        claim = next(r for r in runs if r["mode"] == mode and r["batches"] == sizes[0])
        holds = claim["peak_bytes"] <= 2 * (claim["baseline_bytes"] + bound)
        within = within and holds
        print(
            f"{mode}, input {sizes[0]} batches: peak RSS "
            f"{'within' if holds else 'NOT within'} 2x (baseline + batch x depth)"
        )
    results = work / "memory.json"
    results.write_text(
        json.dumps(
            {
                "command": command,
                "batch_rows": args.batch_rows,
                "batch_bytes": batch_bytes,
                "depth": DEPTH,
                "load": [load_before, load_after],
                "runs": runs,
            },
            indent=2,
        )
    )
    print(f"figures: {results}")
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
