"""Run a job from a test and keep what it left: the result, the archive, the output.

    run = run_job(my_job.build(data, tmp_path / "out"), tailguard_local_spark, tmp_path)
    assert_succeeded(run)
    assert_output_equals(run, my_job.reference(data), ignore_order=True)

Built on `tailguard.run` (agent/entry.py). Without services the job runs with the log in its
archive only and every decision is the agent's own fallback; with `services=` (the
`tailguard_services` fixture) it publishes to the session's broker, the services decide, and the
job uses the services' policy settings so that replay can reproduce their decisions.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tailguard.agent.driver.hooks import JobHooks
    from tailguard.agent.driver.result import AttemptSummary, RunResult
    from tailguard.agent.graph.api import Job
    from tailguard.model.config import Settings
    from tailguard.model.records import Record
    from tailguard.replay.engine import Recorded
    from tailguard.testing.harness import Services

# Settings that belong to one run, never taken from the services' settings file.
RUN_SETTINGS = ("tailguard.work-dir", "tailguard.archive-dir")


@dataclass
class JobRun:
    """One finished run: `result` (`RunResult`), its `archive`, `records`, `output()`."""

    job: Job
    result: RunResult
    settings: Settings  # what the run used (replay needs the same)
    work_dir: Path
    _records: list[Recorded] | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return self.result.ok

    @property
    def archive(self) -> str:
        """The job's archive (a local path, or a URI when the archive dir is one)."""
        if self.result.archive is None:
            raise AssertionError(f"job {self.result.job_id} has no archive")
        return self.result.archive

    @property
    def recorded(self) -> list[Recorded]:
        """Every record of the archive with the topic it travelled on, in order."""
        if self._records is None:
            from tailguard.replay.inputs import read_archive

            self._records = list(read_archive(self.archive, self.settings))
        return self._records

    @property
    def records(self) -> list[Record]:
        """Every record of the archive (events, findings, commands), in order."""
        return [item.record for item in self.recorded]

    def of(self, kind: type[Any]) -> list[Any]:
        """The archived records of one type, e.g. `run.of(records.NodeBlocked)`."""
        return [x for x in self.records if isinstance(x, kind)]

    def attempts(self, vertex: str | None = None) -> list[AttemptSummary]:
        """The attempts of a chain, or of the chain that ran the operator `vertex`."""
        if vertex is None:
            return list(self.result.attempts)
        chains = set(chains_of(self.result, vertex))
        return [a for a in self.result.attempts if a.vertex in chains]

    def output(self, sink: str | None = None) -> Any:
        """The committed output of a sink (the only one if `sink` is None) as a `pyarrow.Table`:
        exactly the files its `_SUCCESS` manifest names, in subtask order."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        from tailguard import filesystems
        from tailguard.agent.executor.sinks import committed_files

        outputs = self.result.outputs
        if sink is None:
            if len(outputs) != 1:
                raise ValueError(f"the job has sinks {sorted(outputs)}: name one, output(sink=)")
            sink = next(iter(outputs))
        if sink not in outputs:
            raise ValueError(f"no sink {sink!r}; the job's sinks are {sorted(outputs)}")
        location = outputs[sink]
        files = committed_files(location)
        if files is None:
            raise AssertionError(
                f"sink {sink} at {location} is not committed (no _SUCCESS): "
                f"the job ended {self.result.status}"
                + (f" ({self.result.message})" if self.result.message else "")
            )
        tables = []
        for name in sorted(files):
            fs, path = filesystems.open_location(filesystems.join(location, name))
            tables.append(pq.read_table(path, filesystem=fs))
        if not tables:
            return pa.table({})
        return pa.concat_tables(tables, promote_options="default")

    def summary(self) -> str:
        return self.result.summary()


def chains_of(result: RunResult, vertex: str) -> list[str]:
    """The chains (as named in events) that ran `vertex`: itself if it names a chain, else
    every chain holding that operator. Unknown names are an error listing the known ones."""
    if vertex in result.chains:
        return [vertex]
    holding = [chain for chain, operators in result.chains.items() if vertex in operators]
    if holding:
        return holding
    if any(a.vertex == vertex for a in result.attempts):
        return [vertex]
    operators = sorted({op for ops in result.chains.values() for op in ops})
    raise ValueError(
        f"no vertex {vertex!r} in job {result.job_id}; operators: {', '.join(operators)}; "
        f"chains: {', '.join(sorted(result.chains))}"
    )


# ---------------------------------------------------------------------- shipping the job's code


@functools.cache
def _installed_top_level_names() -> frozenset[str]:
    from importlib.metadata import packages_distributions

    return frozenset(packages_distributions())


def _callables(value: Any, depth: int = 3) -> Iterable[Callable[..., Any]]:
    """Functions held by a vertex definition: its operator step's function, and any inside
    the step's dataclass fields or containers (a few levels down)."""
    if isinstance(value, types.FunctionType | types.MethodType | functools.partial):
        yield value
    elif depth <= 0:
        return
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for item in dataclasses.fields(value):
            yield from _callables(getattr(value, item.name), depth - 1)
    elif isinstance(value, list | tuple | set | frozenset):
        for item in value:
            yield from _callables(item, depth - 1)
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _callables(item, depth - 1)


def _module_of(fn: Callable[..., Any]) -> str | None:
    if isinstance(fn, functools.partial):
        return _module_of(fn.func)
    if isinstance(fn, types.MethodType):
        return _module_of(fn.__func__)
    return getattr(fn, "__module__", None)


def modules_to_ship(job: Job) -> list[types.ModuleType]:
    """The user's own modules behind the job's operators: the top-level package of every
    operator's module that no installed distribution provides (a test module, the project's
    `jobs` package). The executors cannot import those, so their code travels by value."""
    shipped: dict[str, types.ModuleType] = {}
    for vertex in job.vertices.values():
        for fn in _callables(vertex):
            name = _module_of(fn)
            if not name or name == "__main__":
                continue  # cloudpickle ships __main__'s functions by value already
            top = name.partition(".")[0]
            if top in sys.stdlib_module_names or top in _installed_top_level_names():
                continue
            module = sys.modules.get(top)
            if module is not None:
                shipped[top] = module
    return list(shipped.values())


def ship_job_code(job: Job) -> list[str]:
    """Make the job's own (not installed) modules go to the executors by value; their names."""
    from pyspark import cloudpickle

    modules = modules_to_ship(job)
    for module in modules:
        cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]
    return [m.__name__ for m in modules]


# ---------------------------------------------------------------------- running


def run_settings(
    work_dir: Path, services: Services | None, settings: Mapping[str, str] | None
) -> Settings:
    """The run's settings: its own work and archive dirs under `work_dir`, the services'
    settings file (policy, broker, signing key) when there are services, then `settings`."""
    from tailguard.model.config import Settings

    values: dict[str, str] = {}
    if services is not None:
        overrides = services.settings.overrides()
        values.update({k: v for k, v in overrides.items() if k not in RUN_SETTINGS})
    values["tailguard.work-dir"] = str(work_dir / "work")
    values["tailguard.archive-dir"] = str(work_dir / "archive")
    values.update(settings or {})
    return Settings(values)


def run_job(
    job: Job,
    spark: Any,
    work_dir: str | Path,
    *,
    services: Services | None = None,
    settings: Mapping[str, str] | None = None,
    hooks: JobHooks | None = None,
    ship_code: bool = True,
    job_id: str | None = None,
    storage: str | None = None,
) -> JobRun:
    """Run `job` on `spark` and return its `JobRun`, whatever the job's outcome.

    - `work_dir`: where this run's storage and archive go (a test's `tmp_path`).
    - `services`: the `tailguard_services` fixture; without it the job runs on its archive
      alone and the agent's fallbacks decide.
    - `settings`: extra settings for this run (policy settings belong with the services'
      marker when there are services, or replay would use other settings than they did).
    - `hooks`: the test's `JobHooks` (`on_event`, `on_start`, `fail_attempts`).
    - `ship_code`: send the user's own modules behind the operators by value (see
      `modules_to_ship`); switch off to see what executors without that code would do.
    - `storage`: where result partitions live (a path or a URI such as `s3://bucket/x`;
      default `<work_dir>/work/storage`).
    """
    from tailguard.agent.entry import run

    directory = Path(work_dir)
    run_with = run_settings(directory, services, settings)
    if ship_code:
        ship_job_code(job)
    result = run(
        job,
        spark,
        log_mode="kafka" if services is not None else "archive",
        services=services is not None,
        settings=run_with,
        progress=False,
        hooks=hooks,
        job_id=job_id,
        storage=storage,
    )
    return JobRun(job, result, run_with, directory)
