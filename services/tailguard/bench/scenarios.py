"""What `tailguard bench` runs: the scenarios, the contenders and the data sizes.

Every contender does the same Python work (`sales_by_region.score`) on the same generated files,
on the same 3-worker local cluster; only the scheduling differs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

JobShape = Literal["sales", "skew"]


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    shape: JobShape  # "sales": CPU work before the shuffle; "skew": CPU work after it
    skew: float = 0.0  # extra weight of the first region (9 -> it holds 10x each other one)
    slow_factor: float = 1.0  # 1: no slow node
    # None: slow for the whole job; otherwise the slow node recovers after this many seconds.
    slow_for_s: float | None = None

    @property
    def has_slow_node(self) -> bool:
        return self.slow_factor > 1.0


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("S1", "one node 5x slow for the whole job", "sales", slow_factor=5.0),
        Scenario(
            "S2",
            "one node 5x slow for 4 s, then healthy again",
            "sales",
            slow_factor=5.0,
            slow_for_s=4.0,
        ),
        Scenario("S3", "data skew: one key holds 10x the data of each other key", "skew", skew=9.0),
        Scenario("S4", "healthy cluster (overhead)", "sales"),
    )
}


@dataclass(frozen=True)
class Contender:
    name: str
    tailguard: bool
    services: bool = False
    # Spark confs of the plain-PySpark contenders (empty: speculation off, Spark's defaults).
    spark_conf: tuple[tuple[str, str], ...] = ()


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
)
SERVICES_CONTENDER = CONTENDERS[0].name
PLAIN_CONTENDERS = tuple(c.name for c in CONTENDERS if not c.tailguard)


@dataclass(frozen=True)
class DataSize:
    files: int
    rows_per_file: int  # two row groups (splits) per file
    work: int  # rounds of `score` per row: the CPU per row

    @property
    def splits(self) -> int:
        return self.files * 2


# Full: 24 splits = 8 per slot in the CPU stage (several waves); ~10 s on a healthy cluster
# when the machine is quiet (the whole bench must stay under 30 min on 2 cores).
FULL = DataSize(files=12, rows_per_file=12_000, work=8_000)
QUICK = DataSize(files=6, rows_per_file=12_000, work=6_000)

# The control-plane settings of every tailguard run (the services read the same file). Scaled to
# ten-second jobs as in the demo; blocks short enough to expire inside S2's job. With 64 KiB per
# task a source gets one subtask per split (~74 KB each), so both sides run the same tasks, and
# with max-parallelism twice the splits the skew job's keyed stage gets fewer subtasks than
# subpartitions: the case where byte-balanced ranges matter.
BENCH_POLICY: dict[str, str] = {
    "slow-task-detector.check-interval": "250 ms",
    "slow-task-detector.execution-time.baseline-lower-bound": "1 s",
    "execution.batch.speculative.block-slow-node-duration": "6 s",
    "execution.batch.adaptive.auto-parallelism.avg-data-volume-per-task": "64 KiB",
    "decider.timeout": "5 s",
    "failover.timeout": "5 s",
}


def policy_for(size: DataSize) -> dict[str, str]:
    return {
        **BENCH_POLICY,
        "execution.batch.adaptive.auto-parallelism.max-parallelism": str(2 * size.splits),
    }


def select(names: str | None) -> list[Scenario]:
    if not names:
        return list(SCENARIOS.values())
    chosen = [n.strip().upper() for n in names.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in SCENARIOS]
    if unknown:
        raise ValueError(f"unknown scenario(s) {unknown}; choose from {sorted(SCENARIOS)}")
    return [SCENARIOS[n] for n in chosen]
