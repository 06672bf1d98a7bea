"""What `tailguard bench` runs: the scenarios, the contenders and the sizes.

Two families, each on its own local cluster, because a slow node can only be made honestly in
one of two ways on a small machine (design §7):

- **I/O mode** (`io-*`): 6 workers on 2 cores. A task's work is a wait of `task_s` healthy-host
  seconds, scaled by its host's slowness factor (`tailguard.cluster.slowness.io_work`), so six
  executors fit on two cores and a node slowed 5x really loses 4/5 of its capacity. Tasks of
  2 s: the problem tailguard addresses exists for long tasks.
- **CPU mode** (`cpu-*`): the CPU-bound demo job (`sales_by_region.score`) with no more
  executors than cores, so a node's CPU is its own. Healthy only: pausing a node's process tree
  would hand its CPU to the others as soon as there are more executors than cores.

Every contender does the same work on the same generated files; only the scheduling differs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Literal

from tailguard.model.config import DEFAULTS

# "io-frame": the I/O job as a team writes it in PySpark's DataFrame API (Parquet ->
# `mapInPandas` -> `groupBy().agg` -> Parquet), the job attach mode is for; "io": the same work as
# an RDD of Arrow tables (`plain_spark`), the fastest plain form, against tailguard's own job.
# "io-skew": orders joined to customers with one hot customer, then the wait per joined row
# (`skew_join`): skewed join splitting (issue 27) against Spark AQE's skew join.
JobShape = Literal["sales", "skew", "io", "io-frame", "io-skew"]
Mode = Literal["cpu", "io"]


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    # "io"/"io-frame": waits before the shuffle; "sales"/"skew": CPU work before/after it
    shape: JobShape
    skew: float = 0.0  # extra weight of the first region (9 -> it holds 10x each other one)
    slow_factor: float = 1.0  # 1: no slow node
    # None: slow for the whole job; otherwise the slow node recovers after this many seconds.
    slow_for_s: float | None = None
    # None: slow from the start; otherwise the node turns slow this many seconds into the run
    # (I/O mode: the slowness file's own start, so no process has to stay alive to do it).
    slow_after_s: float | None = None
    healthy: str | None = None  # the scenario that gives the ideal (same job, no slow node)
    # I/O mode: waiting stages one after the other (`IoSize.stages`), and files (two splits
    # each, a task per split per stage) in place of the bench's size; None: the bench's.
    stages: int = 1
    files: int | None = None

    @property
    def mode(self) -> Mode:
        return "io" if self.shape in ("io", "io-frame", "io-skew") else "cpu"

    @property
    def has_slow_node(self) -> bool:
        return self.slow_factor > 1.0

    @property
    def slow_throughout(self) -> bool:
        """One node slow for the whole job (and after it: the second job's case)."""
        return self.has_slow_node and self.slow_for_s is None and not self.slow_after_s

    def io_size(self, io: IoSize) -> IoSize:
        """The bench's I/O size as this scenario runs it."""
        return replace(io, stages=self.stages, files=self.files or io.files)


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("io-healthy", "I/O mode, healthy cluster", "io"),
        Scenario(
            "io-slow",
            "I/O mode, one node 5x slow for the whole job",
            "io",
            slow_factor=5.0,
            healthy="io-healthy",
        ),
        Scenario(
            "io-recovers",
            "I/O mode, one node 5x slow for the first 6 s, then healthy again",
            "io",
            slow_factor=5.0,
            slow_for_s=6.0,
            healthy="io-healthy",
        ),
        Scenario(
            "io-turns-slow",
            "I/O mode, one node turns 5x slow 6 s into the job",
            "io",
            slow_factor=5.0,
            slow_after_s=6.0,
            healthy="io-healthy",
        ),
        # Three shuffles: two rebalances between waiting stages, then the keyed aggregation.
        # Half the splits, so a stage is three waves and a run stays near the others' length.
        Scenario(
            "io-stages-healthy",
            "I/O mode, three shuffles (three waiting stages of 18 tasks), healthy cluster",
            "io",
            stages=3,
            files=9,
        ),
        Scenario(
            "io-stages-slow",
            "I/O mode, three shuffles (three waiting stages of 18 tasks), one node 5x slow "
            "throughout",
            "io",
            slow_factor=5.0,
            healthy="io-stages-healthy",
            stages=3,
            files=9,
        ),
        Scenario(
            "io-frame-healthy",
            "I/O mode, the DataFrame job (mapInPandas, groupBy), healthy cluster",
            "io-frame",
        ),
        Scenario(
            "io-frame-slow",
            "I/O mode, the DataFrame job (mapInPandas, groupBy), one node 5x slow throughout",
            "io-frame",
            slow_factor=5.0,
            healthy="io-frame-healthy",
        ),
        Scenario(
            "io-join-skew",
            "I/O mode, a join with one hot key (its subpartition 20x the median), the wait "
            "after the join, healthy cluster",
            "io-skew",
        ),
        Scenario("cpu-sales", "CPU mode, the sales demo job, healthy cluster", "sales"),
        Scenario(
            "cpu-skew", "CPU mode, data skew: one key holds 10x the data of each other", "skew", 9.0
        ),
    )
}
DEFAULT_SCENARIOS = ("io-healthy", "io-slow", "cpu-sales")
# --quick: each contender run costs ~1 min of session and executor start-up on 2 cores whatever
# the job, so a few minutes allow only the slow-node scenario, the sales job and three
# contenders (tailguard with services against plain PySpark with and without speculation).
QUICK_SCENARIOS = ("io-slow", "cpu-sales")
QUICK_CONTENDERS = ("tailguard+services", "pyspark", "pyspark+speculation")


@dataclass(frozen=True)
class Contender:
    name: str
    tailguard: bool
    services: bool = False
    # Spark confs of the plain-PySpark contenders (empty: speculation off, Spark's defaults).
    spark_conf: tuple[tuple[str, str], ...] = ()
    # The plain PySpark job, unchanged, under `tailguard.attach` with the services (attach mode).
    attach: bool = False
    # tailguard's job settings over the bench's (the services honour them for that job alone).
    job_settings: tuple[tuple[str, str], ...] = ()
    # Run only when named (`--contenders`): a variant that answers one scenario's question.
    named_only: bool = False


CONTENDERS: tuple[Contender, ...] = (
    Contender("tailguard+services", tailguard=True, services=True),
    Contender("tailguard (no services)", tailguard=True, services=False),
    Contender("pyspark", tailguard=False),
    Contender("pyspark+speculation", tailguard=False, spark_conf=(("spark.speculation", "true"),)),
    Contender(
        "pyspark+speculation(flink-like)",
        tailguard=False,
        spark_conf=(
            ("spark.speculation", "true"),
            ("spark.speculation.multiplier", "1.5"),
            ("spark.speculation.quantile", "0.75"),
        ),
    ),
    Contender("pyspark+tailguard-attach", tailguard=False, services=True, attach=True),
    # The skew scenario's baseline (issue 27): the same job and services, the join not split.
    Contender(
        "tailguard+services (no skew split)",
        tailguard=True,
        services=True,
        job_settings=(("table.optimizer.skewed-join-optimization.strategy", "none"),),
        named_only=True,
    ),
    # The slow-host rule without its recent windows (issue 24): the average since deploying
    # alone, as before them, for a node that turns slow in the middle of an attempt.
    Contender(
        "tailguard+services (average only)",
        tailguard=True,
        services=True,
        job_settings=(("slow-task-detector.slow-host.window", "0"),),
        named_only=True,
    ),
)
SERVICES_CONTENDER = CONTENDERS[0].name
TAILGUARD_CONTENDERS = tuple(c.name for c in CONTENDERS if c.tailguard)
# Spark's own mechanisms: the plain contenders, not the attached one.
PLAIN_CONTENDERS = tuple(c.name for c in CONTENDERS if not c.tailguard and not c.attach)
PYSPARK_CONTENDER = "pyspark"
TUNED_SPECULATION_CONTENDER = "pyspark+speculation(flink-like)"
ATTACH_CONTENDER = "pyspark+tailguard-attach"
NO_SKEW_SPLIT_CONTENDER = "tailguard+services (no skew split)"
# Not a contender of its own: after each attached run on a node slow for the whole job, a
# second attached application on the same cluster, the host still slow (`Bench._second_job`).
SECOND_JOB = f"{ATTACH_CONTENDER}, second job"
# The order of the tables' rows: the second job under the run it follows.
ROW_ORDER = (*(c.name for c in CONTENDERS), SECOND_JOB)
# `make bench-attach` (scenarios io-frame-*): the unmodified DataFrame job, plain, with Spark's
# speculation both ways, attached.
ATTACH_CONTENDERS = (
    "pyspark",
    "pyspark+speculation",
    "pyspark+speculation(flink-like)",
    "pyspark+tailguard-attach",
)
# The second job must start while the first attached application's fleet block is in force:
# after a session's start-up and warm-up (about 2 min at the bench's load, the block counted
# from the first job's last evidence: 2 min expired 4 s before the second job's query), so
# longer than the default minute that BENCH_POLICY keeps (`Bench` uses it when a second job
# runs; it clears the fleet list before every other run that reads it, so no other run
# inherits the block).
SECOND_JOB_BLOCK = "5 min"
BLOCK_DURATION_KEY = "execution.batch.speculative.block-slow-node-duration"


@dataclass(frozen=True)
class DataSize:
    """CPU mode: the sales data and the CPU work per row."""

    files: int
    rows_per_file: int  # two row groups (splits) per file
    work: int  # rounds of `score` per row: the CPU per row

    @property
    def splits(self) -> int:
        return self.files * 2


@dataclass(frozen=True)
class IoSize:
    """I/O mode: `tasks` splits of equal rows, each `task_s` seconds of wait on a healthy host.

    `stages` > 1 waits again after each round-robin exchange, at the same parallelism (each
    subtask gets a split's worth of rows): a job with several stages, in which a slow node
    gets a task in each."""

    files: int
    rows_per_file: int  # two row groups (splits) per file
    task_s: float
    workers: int
    stages: int = 1

    @property
    def tasks(self) -> int:
        return self.files * 2

    @property
    def rows_per_split(self) -> int:
        return self.rows_per_file // 2


def cpu_workers() -> int:
    """No more executors than cores (at most 3): a CPU-bound node's CPU is then its own."""
    return max(1, min(3, os.cpu_count() or 1))


# CPU mode. 24 splits of 6,000 rows (~74 KB each: one source subtask per split at 64 KiB per
# task); several waves per slot.
FULL = DataSize(files=12, rows_per_file=12_000, work=8_000)
QUICK = DataSize(files=6, rows_per_file=12_000, work=6_000)
# I/O mode. 36 tasks of 2 s on 6 workers: 6 waves, 12 s healthy at best, 14 s with one node 5x
# slow (see `report.io_limit`). The splits are as large as CPU mode's, so the same policy gives
# one source subtask per split. Quick: 18 tasks, 3 waves.
IO_FULL = IoSize(files=18, rows_per_file=12_000, task_s=2.0, workers=6)
IO_QUICK = IoSize(files=9, rows_per_file=12_000, task_s=2.0, workers=6)

# The control-plane settings of every tailguard run (the services read the same file). Scaled to
# jobs of ten to twenty seconds; blocks short enough to expire inside a job. With 64 KiB per
# task a source gets one subtask per split (~74 KB each), so both sides run the same tasks, and
# with max-parallelism twice the splits the skew job's keyed stage gets fewer subtasks than
# subpartitions: the case where byte-balanced ranges matter.
#
# Blocks last tailguard's default (1 min), not a few seconds: issue 24 measures the defaults,
# and early unblock already frees a host whose slow attempts are gone. With 6 s (this bench's
# value until issue 24) a slow node blocked in a three-shuffle job was let back in before each
# later stage, and each time one of its attempts ran slow again before it was re-blocked.
BENCH_POLICY: dict[str, str] = {
    "slow-task-detector.check-interval": "250 ms",
    "slow-task-detector.execution-time.baseline-lower-bound": "1 s",
    "execution.batch.adaptive.auto-parallelism.avg-data-volume-per-task": "64 KiB",
    "decider.timeout": "5 s",
    "failover.timeout": "5 s",
}


# tailguard's own I/O jobs read a split in batches of 1,000 rows, six per split, each waited for
# in turn (the wait is per row: `io_job`). The bench's splits are tiny (6,000 rows, ~74 KB) so
# that a task's work is its wait; at the default 10,000 rows a split was one batch, read at
# once, and no progress showed until the attempt ended. A real I/O-bound split (MBs) is read in
# many batches, and a slow disk shows as a slow read rate: six batches make that visible here.
# The same work, the same waits, for every contender; Spark's rules read no progress.
IO_JOB_SETTINGS: dict[str, str] = {"python.fn-execution.arrow.batch.size": "1000"}


# The attached contender's relay over BENCH_POLICY: tailguard's default check interval. Spark
# reports a running task's reads once per executor heartbeat (2 s with `spark_conf()`), so a
# Tick every 250 ms (for owned jobs, whose slot runners report every 500 ms) adds seven Ticks of
# no new evidence per heartbeat, each a message through the broker to three services: measured
# (bench/cpu.py, io-frame-healthy at load 16) the attached run's control plane took 6.9 CPU-s
# against a plain run's 2.4, the broker 3.8 against 1.2, and a third of the messages were Ticks.
ATTACH_POLICY: dict[str, str] = {"slow-task-detector.check-interval": "1 s"}


def block_duration() -> str:
    """How long a block lasts in the bench's runs (but a second job's)."""
    return BENCH_POLICY.get(BLOCK_DURATION_KEY, DEFAULTS[BLOCK_DURATION_KEY])


def policy_for(size: DataSize, io: IoSize | None = None) -> dict[str, str]:
    splits = max(size.splits, io.tasks if io else 0)
    return {
        **BENCH_POLICY,
        "execution.batch.adaptive.auto-parallelism.max-parallelism": str(2 * splits),
    }


def select(names: str | None, default: tuple[str, ...] = DEFAULT_SCENARIOS) -> list[Scenario]:
    chosen = [n.strip().lower() for n in names.split(",") if n.strip()] if names else default
    unknown = [n for n in chosen if n not in SCENARIOS]
    if unknown:
        raise ValueError(f"unknown scenario(s) {unknown}; choose from {sorted(SCENARIOS)}")
    return [SCENARIOS[n] for n in chosen]


def select_contenders(
    names: str | None, default: tuple[str, ...] | None = None
) -> tuple[Contender, ...]:
    """Contenders by name (comma-separated), in the standard order; None: `default`, or all
    but those run only when named."""
    by_name = {c.name: c for c in CONTENDERS}
    if names:
        wanted = [n.strip() for n in names.split(",") if n.strip()]
    else:
        wanted = list(default) if default else [c.name for c in CONTENDERS if not c.named_only]
    unknown = [n for n in wanted if n not in by_name]
    if unknown:
        raise ValueError(f"unknown contender(s) {unknown}; choose from {list(by_name)}")
    return tuple(c for c in CONTENDERS if c.name in wanted)
