"""Starting and stopping the services as separate processes (`tailguard services up|down|status`).

Each service runs as `python -m tailguard.shell.worker NAME` in its own session, logs to
`<work>/services/NAME.log`, and announces itself in `<work>/services/NAME.json` once its metrics
endpoint listens: a supervised process's record (`tailguard.processes.supervised`: pid, create
time, command, log, health endpoint) and its metrics address. `up` returns when every service
reports ready.
"""

from __future__ import annotations

import os
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tailguard.model.durations import seconds_text
from tailguard.processes import supervised
from tailguard.shell import instances, stop_report
from tailguard.system.services import SERVICE_NAMES

# On a service's command line: what a recorded pid must run where no create time was recorded.
WORKER_MODULE = "tailguard.shell.worker"


class ServiceError(RuntimeError):
    pass


@dataclass(frozen=True)
class RunningService:
    name: str  # the instance's: "detector", "detector-2" (shell/instances.py)
    pid: int
    metrics_url: str
    created: float = 0.0

    @property
    def service(self) -> str:
        """The service it is an instance of."""
        return instances.service_of(self.name) or self.name

    @property
    def process(self) -> supervised.Supervised:
        return supervised.Supervised(self.pid, self.created)

    def healthy(self, timeout: float = 1.0) -> bool:
        return self.health(timeout) == "ready"

    def health(self, timeout: float = 1.0) -> str:
        """ "ready", or why not: what its /health says ("starting", "broker unreachable for
        12 s: ..."), or that it does not answer."""
        return supervised.http_health(f"{self.metrics_url}/health", timeout)

    def metrics(self, timeout: float = 2.0) -> dict[str, float]:
        """Its samples by name, each with its labels but `service` (the same on all of them):
        `tailguard_service_records_emitted_total{record="SetParallelism"}`."""
        # Here, not at the top: `services status|down` work without the services extra.
        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(f"{self.metrics_url}/metrics", timeout=timeout) as reply:
            text = reply.read().decode()
        values: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = ",".join(
                    f'{k}="{v}"' for k, v in sorted(sample.labels.items()) if k != "service"
                )
                values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
        return values


def services_dir(work_dir: Path) -> Path:
    return work_dir / "services"


def announce(work_dir: Path, name: str, pid: int, metrics_url: str) -> None:
    """Called by a worker once its metrics endpoint listens."""
    directory = services_dir(work_dir)
    record = supervised.Supervised.of(
        pid, supervised.cmdline(pid) or (), directory / f"{name}.log", f"{metrics_url}/health"
    )
    supervised.write_json(
        directory / f"{name}.json", {**record.to_dict(), "metrics_url": metrics_url}
    )


def running(work_dir: Path) -> dict[str, RunningService]:
    """The services whose state file names a process that is still theirs; a state file
    naming a dead process (or one that got a dead service's pid) is removed."""
    found: dict[str, RunningService] = {}
    for name in instances.announced(services_dir(work_dir).glob("*.json")):
        path = services_dir(work_dir) / f"{name}.json"
        try:
            data = supervised.read_json(path)
            if data is None:
                continue
            record = supervised.Supervised.from_dict(data)
            metrics_url = str(data["metrics_url"])
        except (ValueError, KeyError, TypeError):
            continue  # being written by an older release, or not a state file at all
        if record.ours(WORKER_MODULE):
            found[name] = RunningService(name, record.pid, metrics_url, record.created)
        else:
            path.unlink(missing_ok=True)
    return found


def start(
    work_dir: Path,
    names: Sequence[str] = SERVICE_NAMES,
    config: str | None = None,
    env: dict[str, str] | None = None,
    timeout_s: float = 90.0,
    report: Callable[[str], None] = print,
    log_format: str | None = None,
    on_launch: Callable[[str, int], None] | None = None,
    env_of: Callable[[str], Mapping[str, str]] | None = None,
    count: int = 1,
) -> dict[str, RunningService]:
    """Start the named services that are not already running; wait until all are ready.
    `env` is added to each one's environment, and `env_of(name)` to that service's own (its
    Kafka login, where each service is a principal of its own: broker/secure.py).
    `log_format` ("text", "json") is how they write their log files (default text);
    `on_launch(name, pid)` is called as each process is launched, before the wait (the test
    harness writes it down then, so a run killed during the wait leaves none behind).
    `count` instances of each service that scales out, one of the others (`instances.wanted`);
    returns every instance of the named services, by instance name."""
    unknown = sorted(set(names) - set(SERVICE_NAMES))
    if unknown:
        raise ServiceError(f"unknown service(s) {unknown}; choose from {list(SERVICE_NAMES)}")
    directory = services_dir(work_dir)
    directory.mkdir(parents=True, exist_ok=True)
    already = running(work_dir)
    launched: dict[str, int] = {}
    try:
        runs = instances.wanted(names, count, report)
    except instances.InstancesError as err:
        raise ServiceError(str(err)) from None
    for service, instance in runs:
        name = instances.instance_name(service, instance)
        if name in already:
            report(f"{name}: already running (pid {already[name].pid})")
            continue
        (directory / f"{name}.json").unlink(missing_ok=True)
        command = [
            sys.executable,
            "-m",
            WORKER_MODULE,
            service,
            "--work-dir",
            str(work_dir),
            *(["--instance", str(instance)] if instance > 1 else []),
        ]
        if config:
            command += ["--config", config]
        if log_format:
            command += ["--log-format", log_format]
        process = supervised.launch(
            command,
            directory / f"{name}.log",
            env={**os.environ, **(env or {}), **(env_of(service) if env_of else {})},
        )
        launched[name] = process.pid
        if on_launch is not None:
            on_launch(name, process.pid)
        report(f"{name}: starting (pid {process.pid})")
    deadline = time.monotonic() + timeout_s
    waiting = set(launched)
    while waiting:
        current = running(work_dir)
        for name in sorted(waiting):
            if not supervised.alive(launched[name]):
                raise ServiceError(
                    f"{name} exited during start-up; see {directory / (name + '.log')}"
                )
            if name in current and current[name].healthy():
                report(f"{name}: ready, metrics at {current[name].metrics_url}/metrics")
                waiting.discard(name)
        if waiting and time.monotonic() > deadline:
            raise ServiceError(f"not ready after {seconds_text(timeout_s)}: {sorted(waiting)}")
        if waiting:
            time.sleep(0.2)  # polling HTTP health: the services have no other way to call back
    return {n: s for n, s in running(work_dir).items() if s.service in names}


def stop(
    work_dir: Path,
    names: Sequence[str] = SERVICE_NAMES,
    timeout_s: float = 20.0,
    report: Callable[[str], None] = print,
) -> list[str]:
    """SIGTERM the named services (faust commits and leaves cleanly; with the broker gone, a
    service writes its snapshot and exits at once, and its line says what it could not flush:
    `stop_report`), SIGKILL those still running after a grace. All at once: each one's stop
    waits on its own broker round trips, so in turn they would add up. A service's name stops
    all its instances, an instance's name (`detector-2`) that one."""
    stopping = {
        name: service
        for name, service in running(work_dir).items()
        if name in names or service.service in names
    }
    killed = supervised.stop_all([s.process for s in stopping.values()], timeout_s)
    for name, service in stopping.items():
        if service.pid in killed:
            report(f"{name}: did not stop within {seconds_text(timeout_s)}, killed")
        else:
            left = stop_report.take(services_dir(work_dir), name, service.pid)
            report(f"{name}: {left.describe()}" if left is not None else f"{name}: stopped")
        (services_dir(work_dir) / f"{name}.json").unlink(missing_ok=True)
    return list(stopping)
