"""What a test asks of the harness: the `tailguard_*` markers and options, read into requests.

Pure (no pytest, no Spark): the plugin hands in a marker's arguments and the configured
defaults, and gets a request back or a `HarnessUsageError` that names the marker, the argument
and what is allowed.

    @pytest.mark.tailguard_cluster(workers=3, slow={"127.0.0.4": 5}, slow_mode="io")
    @pytest.mark.tailguard_spark(conf={"spark.sql.shuffle.partitions": "4"})
    @pytest.mark.tailguard_services(settings={"slow-task-detector.check-interval": "200 ms"})
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tailguard.system.services import SERVICE_NAMES

SLOW_MODES = ("cpu", "io")
BROKER_KINDS = ("kafka", "mock")
# The settings the harness owns for the services: where they run and which broker they use.
HARNESS_SETTINGS = ("tailguard.work-dir", "bootstrap.servers")

CLUSTER_MARKER = "tailguard_cluster"
SPARK_MARKER = "tailguard_spark"
SERVICES_MARKER = "tailguard_services"


class HarnessUsageError(ValueError):
    """A marker or option of the tailguard pytest plugin is used wrongly; says which and how."""


@dataclass(frozen=True)
class ClusterShape:
    """What identifies a local cluster: a running one of this shape can be reused."""

    workers: int = 3
    cores: int = 1
    memory: str = "1g"
    # Each worker a cgroup CPU quota of its share of the machine (the harness sets it for a
    # cpu-mode slow host when the workers' cores outnumber the CPUs: `Harness.cluster_for`).
    cpu_budgets: bool = False

    def hosts(self) -> list[str]:
        """The workers' loopback addresses, as `LocalCluster` assigns them."""
        return [f"127.0.0.{i + 2}" for i in range(self.workers)]

    def describe(self) -> str:
        budgets = ", CPU budgets" if self.cpu_budgets else ""
        return f"{self.workers} workers x {self.cores} core(s), {self.memory}{budgets}"


@dataclass(frozen=True)
class ClusterRequest:
    shape: ClusterShape
    # host -> slow-down factor (>= 1), applied after the executors registered.
    slow: Mapping[str, float] = field(default_factory=dict)
    slow_mode: str = "cpu"


@dataclass(frozen=True)
class Defaults:
    """The pytest options / ini values (`tailguard_workers`, ...), already parsed."""

    workers: int = 3
    cores: int = 1
    memory: str = "1g"
    slow_mode: str = "cpu"
    local_master: str = "local[2]"
    # "kafka": Apache Kafka's broker; "mock": librdkafka's in-memory mock (offline).
    broker: str = "kafka"


def _positive_int(value: Any, where: str) -> int:
    """An int, or the digits of one (ini values are strings), of at least 1."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise HarnessUsageError(f"{where} must be a whole number of at least 1, got {value!r}")
    return value


def _slow_mode(value: Any, where: str) -> str:
    return _one_of(value, SLOW_MODES, where)


def _one_of(value: Any, choices: Sequence[str], where: str) -> str:
    if value not in choices:
        raise HarnessUsageError(f"{where} must be one of {list(choices)}, got {value!r}")
    return str(value)


def read_defaults(values: Mapping[str, str | None]) -> Defaults:
    """Defaults from option/ini values (strings; None or empty: the built-in default)."""
    base = Defaults()

    def get(name: str, fallback: Any) -> Any:
        value = values.get(name)
        return fallback if value is None or str(value).strip() == "" else str(value).strip()

    return Defaults(
        workers=_positive_int(get("tailguard_workers", base.workers), "tailguard_workers"),
        cores=_positive_int(get("tailguard_worker_cores", base.cores), "tailguard_worker_cores"),
        memory=str(get("tailguard_worker_memory", base.memory)),
        slow_mode=_slow_mode(get("tailguard_slow_mode", base.slow_mode), "tailguard_slow_mode"),
        local_master=str(get("tailguard_local_master", base.local_master)),
        broker=_one_of(get("tailguard_broker", base.broker), BROKER_KINDS, "tailguard_broker"),
    )


def _only(
    marker: str, args: Sequence[Any], kwargs: Mapping[str, Any], known: Sequence[str]
) -> None:
    if args:
        raise HarnessUsageError(
            f"@pytest.mark.{marker} takes keyword arguments only ({', '.join(known)}), "
            f"got positional {list(args)!r}"
        )
    unknown = sorted(set(kwargs) - set(known))
    if unknown:
        raise HarnessUsageError(
            f"@pytest.mark.{marker}: unknown argument(s) {unknown}; known: {', '.join(known)}"
        )


def cluster_request(
    args: Sequence[Any], kwargs: Mapping[str, Any], defaults: Defaults
) -> ClusterRequest:
    """`@pytest.mark.tailguard_cluster(workers=, cores=, memory=, slow=, slow_mode=)` (all
    optional; no marker: the defaults)."""
    where = f"@pytest.mark.{CLUSTER_MARKER}"
    _only(CLUSTER_MARKER, args, kwargs, ("workers", "cores", "memory", "slow", "slow_mode"))
    shape = ClusterShape(
        workers=_positive_int(kwargs.get("workers", defaults.workers), f"{where}(workers=)"),
        cores=_positive_int(kwargs.get("cores", defaults.cores), f"{where}(cores=)"),
        memory=str(kwargs.get("memory", defaults.memory)),
    )
    slow_mode = _slow_mode(kwargs.get("slow_mode", defaults.slow_mode), f"{where}(slow_mode=)")
    raw_slow = kwargs.get("slow", {})
    if not isinstance(raw_slow, Mapping):
        raise HarnessUsageError(
            f'{where}(slow=) must map hosts to factors, e.g. {{"127.0.0.4": 5}}, got {raw_slow!r}'
        )
    slow: dict[str, float] = {}
    for host, factor in raw_slow.items():
        if host not in shape.hosts():
            raise HarnessUsageError(
                f"{where}(slow=): {host!r} is not a worker of this cluster; its workers are "
                f"{', '.join(shape.hosts())}"
            )
        try:
            value = float(factor)
        except (TypeError, ValueError):
            value = 0.0
        if not value >= 1.0:
            raise HarnessUsageError(
                f"{where}(slow=): the factor of {host} must be a number of at least 1 "
                f"(how many times slower), got {factor!r}"
            )
        slow[str(host)] = value
    if slow and len(slow) == shape.workers:
        raise HarnessUsageError(
            f"{where}(slow=): every worker is slow; a slow node is only slow next to healthy ones"
        )
    return ClusterRequest(shape, slow, slow_mode)


def spark_conf(args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """`@pytest.mark.tailguard_spark(conf={...})`: extra Spark settings for the session, sorted
    (the session is reused by every test asking for the same master and settings)."""
    _only(SPARK_MARKER, args, kwargs, ("conf",))
    conf = kwargs.get("conf", {})
    if not isinstance(conf, Mapping):
        raise HarnessUsageError(
            f"@pytest.mark.{SPARK_MARKER}(conf=) must be a mapping, got {conf!r}"
        )
    return tuple(sorted((str(k), str(v)) for k, v in conf.items()))


@dataclass(frozen=True)
class ServicesRequest:
    # Sorted (key, value) pairs: the services' policy settings (the job must use the same for
    # replay to be exact; `run_job` takes them from the services).
    settings: tuple[tuple[str, str], ...] = ()
    names: tuple[str, ...] = SERVICE_NAMES


def services_request(args: Sequence[Any], kwargs: Mapping[str, Any]) -> ServicesRequest:
    """`@pytest.mark.tailguard_services(settings={...}, names=[...])`."""
    where = f"@pytest.mark.{SERVICES_MARKER}"
    _only(SERVICES_MARKER, args, kwargs, ("settings", "names"))
    settings = kwargs.get("settings", {})
    if not isinstance(settings, Mapping):
        raise HarnessUsageError(f"{where}(settings=) must be a mapping, got {settings!r}")
    owned = sorted(set(settings) & set(HARNESS_SETTINGS))
    if owned:
        raise HarnessUsageError(
            f"{where}(settings=): {owned} are set by the harness (its broker and its own "
            "directory for the services)"
        )
    names = kwargs.get("names", SERVICE_NAMES)
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise HarnessUsageError(f"{where}(names=) must be a list of service names, got {names!r}")
    unknown = sorted(set(names) - set(SERVICE_NAMES))
    if unknown or not names:
        raise HarnessUsageError(
            f"{where}(names=): unknown or no service(s) {unknown}; "
            f"choose from {list(SERVICE_NAMES)}"
        )
    return ServicesRequest(
        tuple(sorted((str(k), str(v)) for k, v in settings.items())),
        tuple(n for n in SERVICE_NAMES if n in names),
    )
