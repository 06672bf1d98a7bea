"""Runs the bench: one broker and the services for the whole bench, one local cluster per mode
(I/O mode: 6 workers; CPU mode: no more workers than cores), started in turn; every contender
run in its own SparkSession (speculation settings are SparkContext confs), contenders
interleaved within each round so drifts in machine load hit all of them alike.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from tailguard import observer
from tailguard.archive import ArchiveReader
from tailguard.bench import cpu, io_job, plain_spark, report, skew_join
from tailguard.bench.scenarios import (
    ATTACH_POLICY,
    BLOCK_DURATION_KEY,
    CONTENDERS,
    IO_JOB_SETTINGS,
    SECOND_JOB,
    SECOND_JOB_BLOCK,
    Contender,
    DataSize,
    IoSize,
    Mode,
    Scenario,
    cpu_workers,
    policy_for,
)
from tailguard.cluster import slowness
from tailguard.examples import sales_by_region as example
from tailguard.model import records as r

Say = Callable[[str], None]
SCORE_VERTEX = "score"  # where the CPU work happens (keyed in the skew job)
IO_VERTEX = "io"  # where the I/O job waits
SPECULATION_KEYS = ("spark.speculation.multiplier", "spark.speculation.quantile")
EXECUTORS_TIMEOUT_S = 600.0
PROBE_ROUNDS = 3


@dataclass
class RunRecord:
    scenario: str
    contender: str
    run_index: int
    job_s: float | None  # None: the run failed
    ok: bool
    output_equal: bool | None = None
    error: str | None = None
    job_id: str | None = None
    archive: str | None = None
    speculative_attempts: int | None = None
    speculative_wins: int | None = None
    blocked_hosts: list[str] = field(default_factory=list)
    parallelism: dict[str, int] = field(default_factory=dict)
    # From the archive (tailguard runs only).
    stage_work: list[dict[str, Any]] = field(default_factory=list)
    speculation_latency_ms: list[dict[str, Any]] = field(default_factory=list)
    decider_latency_ms: list[dict[str, Any]] = field(default_factory=list)
    skewed_subtask: dict[str, Any] | None = None
    # The 1-minute load average when the session was up and when the job had ended.
    load_before: float | None = None
    load_after: float | None = None
    slow_host: str | None = None
    # Per attempt, from `RunResult` (tailguard runs, once the runtime reports them): the
    # deploy -> outcome round trip minus the runner-measured run time, and deploy -> running.
    dispatch_ms: list[float] = field(default_factory=list)
    deploy_to_running_ms: list[float] = field(default_factory=list)
    # Attach mode: per command, from reaching the relay to Spark's answer.
    relay_to_outcome_ms: list[float] = field(default_factory=list)
    commands_applied: int | None = None
    commands_rejected: int | None = None
    # The task-seconds of the attempts killed because their twin won (Spark contenders and
    # attach mode from Spark's status store, tailguard's own runs from the archive), and the
    # tasks started on the slow host (Spark's status store).
    lost_copy_s: float | None = None
    slow_host_tasks: int | None = None
    # When the slow host turned slow (epoch ms), and from its first progress report after
    # that to the first slow-host verdict naming it (tailguard and attached runs, from the
    # archive; None: never named).
    slow_since_ms: int | None = None
    slow_host_found_ms: float | None = None
    # The second job: the hosts on the fleet list when its application started.
    fleet_listed: list[str] = field(default_factory=list)
    # The pieces the decider split skewed join subpartitions into (0: none split; the
    # summary prints it for io-join-skew).
    skew_pieces: int | None = None
    # CPU seconds the job took, per part (`report.CPU_PARTS`, sampled by `bench.cpu`): the
    # control plane, the executors, the driver.
    cpu_s: dict[str, float] | None = None


@dataclass
class BenchRun:
    records: list[RunRecord]
    spark_defaults: dict[str, str]
    wall_s: float
    # The bench policy's values this run changed, and why.
    policy_changes: dict[str, str] = field(default_factory=dict)
    # How the broker was warmed before the first run (None: it was not).
    broker_warm_up: str | None = None


def write_settings(
    work_dir: Path, size: DataSize, io: IoSize, overrides: dict[str, str] | None = None
) -> Path:
    """The bench's settings file, `overrides` in place of its policy's values; the services
    read it too, so both sides agree."""
    values = {
        **policy_for(size, io),
        **(overrides or {}),
        "tailguard.work-dir": str(work_dir),
        "tailguard.archive-dir": str(work_dir / "archive"),
    }
    path = work_dir / "tailguard.toml"
    lines = [f'"{k}" = "{v}"' for k, v in sorted(values.items())]
    path.write_text("# written by `tailguard bench`\n" + "\n".join(lines) + "\n")
    return path


def prepare_data(work_dir: Path, size: DataSize | IoSize, scenario: Scenario) -> Path:
    # The size is in the name so a quick run never reuses a full run's data or vice versa.
    # The I/O job reads the sales data (its work is the wait, not the rows).
    if scenario.shape == "io-skew":
        # Its own data (orders and customers) and size, the same in a quick run.
        k = skew_join.SKEW_SIZE
        path = (
            work_dir
            / "data"
            / (f"orders-skew-{k.splits}x{k.normal_rows}+{k.hot_rows}-{k.subpartitions}")
        )
        if not (path / "_COMPLETE").exists():
            skew_join.generate(path, k)
            (path / "_COMPLETE").write_text("")
        return path
    if scenario.shape == "io-frame":
        # `spark.read.parquet` plans a task per file (plain_spark.run_frame_job), not per row
        # group: one file per split, so every contender runs the same splits.
        assert isinstance(size, IoSize)
        files, rows, groups, shape = size.tasks, size.rows_per_split, 1, "sales-frame"
    else:
        files, rows, groups = size.files, size.rows_per_file, 2
        shape = "sales" if scenario.shape == "io" else scenario.shape
    name = f"{shape}-skew{scenario.skew:g}-{files}x{rows}"
    path = work_dir / "data" / name
    if not (path / "_COMPLETE").exists():
        shutil.rmtree(path, ignore_errors=True)
        example.generate(
            path, files=files, rows_per_file=rows, row_groups_per_file=groups, skew=scenario.skew
        )
        (path / "_COMPLETE").write_text("")
    return path


def tailguard_job(shape: str, data: Path, output: Path, work: int, io: IoSize | None = None) -> Any:
    """The job as a tailguard graph, written the way plain_spark writes it: `score` and
    `partial_sums` in one operator (the plain job runs them in one mapPartitions), and for the
    sales and I/O jobs a single final aggregation task (the plain job's `reduceByKey(_, 1)`).
    The I/O job's operator is `io_job.partials`, the same function the plain job calls."""
    from tailguard.agent.graph.api import Job

    names = {"sales": "sales-by-region", "skew": "sales-skew", "io": "sales-io"}
    # The DataFrame job's work as tailguard's own job: the same waits over the same splits.
    shape = "io" if shape == "io-frame" else shape
    job = Job(names[shape])
    sales = job.read_parquet(str(data), name="sales")
    if shape == "io":
        assert io is not None
        task_s, rows = io.task_s, io.rows_per_split
        # Each earlier stage waits, then hands its rows round robin to the next, which runs at
        # one subtask per split, so every subtask again gets a split's worth (the first stage
        # is chained to the source, which has that parallelism already).
        # Batch by batch (`map_batches`): the wait is per row, so the work is the same as one
        # call over the split, and the attempt reads its input as it goes, as a task that waits
        # on a slow disk would (IO_JOB_SETTINGS' batch size).
        stage: Any = sales
        after: dict[str, Any] = {}
        for k in range(1, io.stages):
            waited = stage.map_batches(
                lambda b: io_job.waited(b, task_s, rows), name=f"{IO_VERTEX}-{k}", **after
            )
            stage, after = waited.rebalance(), {"parallelism": io.tasks}
        partial = stage.map_batches(
            lambda b: io_job.partials(b, task_s, rows), name=IO_VERTEX, **after
        )
        totals = partial.partition_by("region").map(example.final_sums, name="final", parallelism=1)
    elif shape == "sales":
        partial = sales.map(
            lambda t: example.partial_sums(example.score(t, work)), name=SCORE_VERTEX
        )
        totals = partial.partition_by("region").map(example.final_sums, name="final", parallelism=1)
    else:
        # CPU work after a keyed exchange, so the task holding the big key gets its extra rows.
        totals = sales.partition_by("region").map(
            lambda t: example.final_sums(example.partial_sums(example.score(t, work))),
            name=SCORE_VERTEX,
        )
    totals.write_parquet(str(output), name="sink")
    return job


def workers_for(mode: Mode, io: IoSize) -> int:
    return io.workers if mode == "io" else cpu_workers()


class Bench:
    def __init__(
        self,
        work_dir: Path,
        size: DataSize,
        io: IoSize,
        scenarios: list[Scenario],
        runs: int,
        say: Say,
        contenders: tuple[Contender, ...] = CONTENDERS,
        mock_broker: bool = False,
    ) -> None:
        self.work_dir = work_dir
        self.mock_broker = mock_broker
        self.size = size
        self.io = io
        self.scenarios = scenarios
        self.runs = runs
        self.say = say
        self.contenders = contenders
        # The broker's and the services' pids by name, once the stack is up (run()).
        self._control_plane: dict[str, int] = {}
        self._references: dict[Path, pd.DataFrame] = {}

    @property
    def second_jobs(self) -> bool:
        """Whether an attached run on a node slow throughout is followed by a second job."""
        return any(c.attach for c in self.contenders) and any(
            s.mode == "io" and s.slow_throughout for s in self.scenarios
        )

    def run(self) -> BenchRun:
        from tailguard import stack
        from tailguard.settings_file import load_settings

        started = time.monotonic()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        changes = {BLOCK_DURATION_KEY: SECOND_JOB_BLOCK} if self.second_jobs else {}
        config = write_settings(self.work_dir, self.size, self.io, changes)
        settings = load_settings(config, environ={})
        data = {
            s.name: prepare_data(
                self.work_dir, s.io_size(self.io) if s.mode == "io" else self.size, s
            )
            for s in self.scenarios
        }
        records: list[RunRecord] = []
        defaults: dict[str, str] = {}
        modes: list[Mode] = [m for m in ("io", "cpu") if any(s.mode == m for s in self.scenarios)]
        with (
            _quiet_spark_logs(),
            stack.running(
                stack.StackRequest(self.work_dir, config=config, mock_broker=self.mock_broker),
                self.say,
            ) as up_,
        ):
            self._control_plane = _control_plane_pids(up_)
            warmed = self._warm_broker(settings)
            for mode in modes:
                # One cluster at a time, each in its own dir (its shape differs): 6 idle
                # workers would only add load to the CPU-mode runs.
                workers = workers_for(mode, self.io)
                with stack.cluster(self.work_dir / mode, workers, self.say) as cluster:
                    for scenario in (s for s in self.scenarios if s.mode == mode):
                        for i in range(self.runs):
                            for contender in self.contenders:
                                run = (cluster, settings, scenario, contender, i, data, defaults)
                                records.append(self._logged(*run))
                                if contender.attach and scenario.slow_throughout:
                                    records.append(self._logged(*run, second=True))
        return BenchRun(records, defaults, time.monotonic() - started, changes, warmed)

    def _warm_broker(self, settings: Any) -> str | None:
        """Warm Kafka's request paths before the first run (`broker_warmup`), when a contender
        talks to the broker; what was done, for the report."""
        if self.mock_broker or not any(c.attach or c.services for c in self.contenders):
            return None
        from tailguard.bench.broker_warmup import warm_broker

        done = warm_broker(settings)
        what = (
            f"warmed before the first run: {done.records} records, one request each, read by "
            f"{done.readers} consumer groups ({done.seconds:.1f} s), as a running deployment's "
            "broker has been"
        )
        self.say(f"broker {what}")
        return what

    def _logged(
        self,
        cluster: Any,
        settings: Any,
        scenario: Scenario,
        contender: Contender,
        index: int,
        data: dict[str, Path],
        defaults: dict[str, str],
        second: bool = False,
    ) -> RunRecord:
        name = SECOND_JOB if second else contender.name
        label = f"{scenario.name} run {index + 1}/{self.runs}: {name}"
        self.say(f"{label} ...")
        rec = self._one(cluster, settings, scenario, contender, index, data, defaults, second)
        outcome = f"{rec.job_s:.1f} s" if rec.ok and rec.job_s else f"FAILED {rec.error}"
        self.say(f"{label}: {outcome} (load {rec.load_after})")
        return rec

    # ----------------------------------------------------------------- one run

    def _one(
        self,
        cluster: Any,
        settings: Any,
        scenario: Scenario,
        contender: Contender,
        index: int,
        data: dict[str, Path],
        defaults: dict[str, str],
        second: bool = False,
    ) -> RunRecord:
        """One contender's run in a session of its own. `second`: the attached contender's
        second job, which follows its run on a node slow throughout: a new application on the
        same cluster, the host still slow and (if the first blocked it) on the fleet list."""
        from pyspark import SparkContext

        from tailguard import stack

        name = SECOND_JOB if second else contender.name
        slug = name.replace(" ", "").replace("(", "-").replace(")", "").replace("+", "-")
        output = self.work_dir / "out" / f"{scenario.name}-{slug.replace(',', '-')}-{index}"
        shutil.rmtree(output, ignore_errors=True)
        rec = RunRecord(scenario.name, name, index, None, False)
        slow = cluster.hosts()[-1]
        listed: set[str] = set()
        try:
            if second:
                listed = fleet_hosts(settings)
                rec.fleet_listed = sorted(listed)
            elif contender.attach or contender.services:
                # Every run but a second job starts with an empty fleet list: a block from an
                # earlier run (a minute by default, SECOND_JOB_BLOCK when a second job runs)
                # must not stand in a later scenario's run.
                fleet_clear(settings)
        except Exception as err:  # the run goes on; the second job's report shows the list
            self.say(f"the fleet list could not be read or cleared: {err}")
        spark = self._builder(
            cluster.master_url, f"bench {scenario.name} {name}", contender, settings
        ).getOrCreate()
        app_id: str | None = None
        try:
            spark.sparkContext.setLogLevel("ERROR")
            if not defaults:
                defaults.update(_speculation_defaults(spark))
            # Before the clock starts: on a loaded machine a new application's executors wait
            # for the last one's to exit and then take minutes to start (seen at load 60).
            stack.await_executors(spark, cluster.hosts(), timeout_s=EXECUTORS_TIMEOUT_S)
            # A listed host gets no task, not even the warm-up's (it would wait for it).
            usable = [h for h in cluster.hosts() if h not in listed]
            # The warm-up and the probes are not the job: an attached contender's services
            # must not judge their cold tasks (the same calls for every contender).
            with observer.ignoring(spark):
                plain_spark.warm_up(spark.sparkContext, usable)
                if scenario.shape == "io-frame" and not contender.tailguard:
                    plain_spark.warm_frame(spark, data[scenario.name], output.with_name("warm"))
                if scenario.shape == "io-skew" and not contender.tailguard:
                    skew_join.warm_plain(spark, data[scenario.name], output.with_name("warm"))
                if scenario.mode == "io":
                    _check_slowness_reaches_tasks(spark.sparkContext, cluster, usable)
            if scenario.has_slow_node:
                # CPU mode: after registration (a throttled executor registers late).
                cluster.throttle(
                    slow,
                    scenario.slow_factor,
                    duration_s=scenario.slow_for_s,
                    mode=scenario.mode,
                    after_s=scenario.slow_after_s,
                )
                rec.slow_host = slow
                rec.slow_since_ms = _slow_since_ms(cluster, slow)
            rec.load_before = round(os.getloadavg()[0], 2)
            roots = cpu.CpuRoots(
                self._control_plane,
                tuple(w.pid for w in cluster.state.workers),
                (spark.sparkContext._gateway.proc.pid,),
            )
            cpu_before = roots.sample()
            if contender.tailguard:
                self._run_tailguard(spark, settings, scenario, contender, data, output, rec)
            else:
                # The session was built with `tailguard.spark_conf`: attached from its start;
                # `attach` gives the handle (its application id).
                app_id = _attach(spark, settings).app_id if contender.attach else None
                io = scenario.io_size(self.io)
                run = plain_spark.run_job(
                    spark,
                    scenario.shape,
                    data[scenario.name],
                    output,
                    self.size.work,
                    io.task_s,
                    io.rows_per_split,
                    io.stages,
                )
                rec.job_s = run.duration_s
                rec.ok = True
                rec.speculative_attempts = run.speculative_tasks
                rec.stage_work = [asdict(w) for w in run.stage_work]
                rec.lost_copy_s = round(run.lost_copy_s, 3)
                if scenario.has_slow_node:
                    rec.slow_host_tasks = sum(t.host == slow for t in run.spark_tasks)
            rec.cpu_s = cpu.used(cpu_before, roots.sample())
        except Exception as err:  # a failed run is reported, the bench goes on
            rec.ok = False
            rec.error = f"{type(err).__name__}: {err}"[:500]
        finally:
            rec.load_after = round(os.getloadavg()[0], 2)
            spark.stop()
            if SparkContext._active_spark_context is not None:
                raise RuntimeError("the SparkContext is still active after spark.stop()")
            with contextlib.suppress(Exception):
                cluster.unthrottle(slow)
        if app_id is not None:
            # The plugin's relay ends with the application: its summary is complete now.
            _from_attached(settings, app_id, rec)
        if rec.ok:
            rec.output_equal = self._output_equal(data[scenario.name], output, scenario)
            rec.ok = bool(rec.output_equal)
            if not rec.ok:
                rec.error = "output differs from the pandas reference"
        shutil.rmtree(output, ignore_errors=True)
        return rec

    def _builder(self, master: str, app: str, contender: Contender, settings: Any) -> Any:
        """The contender's session: UI off for all (the same conditions); the attached one
        built as docs/attach.md tells a user, with `tailguard.spark_conf` (the plugin, the
        query-stage rule, the 2 s executor heartbeat the slow-host rule needs)."""
        from tailguard.agent.adapters.spark import session_builder
        from tailguard.observer import listener_jar

        if contender.tailguard:
            builder = session_builder(master, app_name=app).config("spark.ui.enabled", "false")
        else:
            conf = list(contender.spark_conf)
            if contender.attach:
                import tailguard

                conf += tailguard.spark_conf({**settings.overrides(), **ATTACH_POLICY}).items()
            builder = plain_spark.session_builder(master, app, conf)
        if any(c.attach for c in self.contenders):
            # Every session of the bench runs in one driver JVM, started with the first; Spark
            # loads a plugin from the classpath that JVM started with (`spark.jars` of a later
            # session reaches only the executors), so the jar is on it from the first session
            # on, whichever contender that is. Nothing else loads it.
            builder = builder.config("spark.driver.extraClassPath", str(listener_jar()))
        return builder

    def _run_tailguard(
        self,
        spark: Any,
        settings: Any,
        scenario: Scenario,
        contender: Contender,
        data: dict[str, Path],
        output: Path,
        rec: RunRecord,
    ) -> None:
        from tailguard.agent.entry import run as run_job

        if scenario.shape == "io-skew":
            job = skew_join.tailguard_job(data[scenario.name], output, skew_join.SKEW_SIZE)
            settings = settings.merged(skew_join.tailguard_settings())
        else:
            job = tailguard_job(
                scenario.shape,
                data[scenario.name],
                output,
                self.size.work,
                scenario.io_size(self.io),
            )
        if scenario.mode == "io":
            settings = settings.merged(IO_JOB_SETTINGS)
        # No services: archive only, so the services (running for the other contender) do not
        # act on this job's events.
        result = run_job(
            job,
            spark,
            log_mode="kafka" if contender.services else "archive",
            services=contender.services,
            settings=settings.merged(dict(contender.job_settings)),
            progress=False,
        )
        rec.job_id = result.job_id
        rec.archive = str(result.archive) if result.archive else None
        rec.ok = result.ok
        rec.error = None if result.ok else result.message
        rec.job_s = result.duration_s
        rec.speculative_attempts = result.speculative_attempts
        rec.speculative_wins = result.speculative_wins
        rec.blocked_hosts = sorted({host for host, _, _ in result.blocked})
        rec.parallelism = {v: p for v, (p, _by) in result.parallelism.items()}
        # Reported by the slot-runner runtime; absent (empty) before it.
        rec.dispatch_ms = [float(v) for v in getattr(result, "dispatch_ms", ())]
        rec.deploy_to_running_ms = [float(v) for v in getattr(result, "deploy_to_running_ms", ())]
        if result.archive:
            _from_archive(Path(result.archive), settings, rec)

    def _output_equal(self, data: Path, output: Path, scenario: Scenario) -> bool:
        if data not in self._references:
            self._references[data] = (
                skew_join.reference(data)
                if scenario.shape == "io-skew"
                else example.reference(data)
            )
        expected = self._references[data]
        actual = example.read_output(output)
        return bool(expected.equals(actual[expected.columns.tolist()]))


def _from_archive(path: Path, settings: Any, rec: RunRecord) -> None:
    from tailguard.replay.inputs import read_archive

    records: list[r.Record] = [x.record for x in read_archive(path, settings)]
    rec.stage_work = [asdict(s) for s in report.stage_work(records)]
    rec.lost_copy_s = round(report.lost_race_s(records), 3)
    _slow_host_found(records, rec)
    rec.speculation_latency_ms = speculation_latency_rows(records)
    rec.decider_latency_ms = [
        {"vertex": v, "ms": ms} for v, ms in report.decider_latencies(records)
    ]
    rec.skew_pieces = report.skew_pieces(records)
    largest = report.largest_input_subtask(records, SCORE_VERTEX)
    if largest is not None:
        speculated = report.speculated_subtasks(records)
        rec.skewed_subtask = {
            "vertex": SCORE_VERTEX,
            "subtask": largest[0],
            "input_bytes": largest[1],
            "speculated": (SCORE_VERTEX, largest[0]) in speculated,
            "speculated_subtasks": sorted(s for v, s in speculated if v == SCORE_VERTEX),
        }


def _slow_since_ms(cluster: Any, host: str) -> int:
    """When `host` turned (or turns) slow, epoch ms: its slowness file's own start in I/O mode,
    else now (a CPU throttle starts when it is set)."""
    written = slowness.read(slowness.slowness_file(cluster.work_dir, host))
    since = written.since if written is not None and written.since is not None else time.time()
    return int(since * 1000)


def _slow_host_found(records: list[r.Record], rec: RunRecord) -> None:
    """From the run's archive: when its slow host was first named slow (tailguard and attach)."""
    if rec.slow_host is not None:
        rec.slow_host_found_ms = report.slow_host_finding_ms(
            records, rec.slow_host, rec.slow_since_ms
        )


def _attach(spark: Any, settings: Any) -> Any:
    """`tailguard.attach` with the bench's settings (its broker and archive dir); the services
    that serve the tailguard contender decide for the attached job too."""
    import tailguard

    return tailguard.attach(spark, settings.overrides())


def _from_attached(settings: Any, app_id: str, rec: RunRecord) -> None:
    """What the attached application's archive and the relay's summary say of the run."""
    archive = Path(settings.get("tailguard.archive-dir") or "work/archive") / f"{app_id}.avro"
    rec.archive = str(archive)
    summary = Path(f"{archive}.attach.json")
    if summary.exists():
        said = json.loads(summary.read_text())
        rec.relay_to_outcome_ms = [float(ms) for ms in said["relay_to_outcome_ms"]]
        rec.commands_applied, rec.commands_rejected = said["applied"], said["rejected"]
    if archive.exists():
        events = [e.record for e in ArchiveReader(archive)]
        rec.blocked_hosts = sorted({e.host for e in events if isinstance(e, r.NodeBlocked)})
        rec.speculative_wins = sum(isinstance(e, r.SpeculativeAttemptWon) for e in events)
        _slow_host_found(events, rec)


def fleet_hosts(settings: Any) -> set[str]:
    """The hosts on the fleet list (`tailguard.blocklist`) now, as an application starting
    now would read them."""
    from tailguard.blocklist.fleet_topic import read_changes
    from tailguard.model.fleet import current_entries

    return set(current_entries(read_changes(settings), int(time.time() * 1000)))


def fleet_clear(settings: Any) -> None:
    """Take every host off the fleet list, as `tailguard blocklist remove HOST` does."""
    from tailguard.blocklist.fleet_topic import operator_removal, publish
    from tailguard.model.authority import OPERATOR

    for host in sorted(fleet_hosts(settings)):
        publish(settings, operator_removal(host, int(time.time() * 1000)), OPERATOR)


def _check_slowness_reaches_tasks(sc: Any, cluster: Any, hosts: list[str]) -> None:
    """Every host's tasks read the slowness file `tailguard cluster` writes for that host, and
    are healthy before the scenario starts: otherwise an I/O-mode run would measure nothing."""
    seen: dict[str, tuple[str | None, float]] = {}
    # A host's answer may come from elsewhere: under Spark's speculation (the plain
    # contenders' at 1.5 / 0.75) a copy of a pinned probe task can run on another host and win,
    # and a plain session keeps Spark's 3 s locality wait. Its host is then probed again, and
    # said so if it never answers (this once failed a run as if the cluster lacked the file:
    # twice in 2026-11-28's issue-24 bench, both the tuned speculation's).
    for _ in range(PROBE_ROUNDS):
        missing = [h for h in hosts if h not in seen]
        if not missing:
            break
        seen.update(plain_spark.probe_slowness(sc, missing))
    for host in hosts:
        want = str(slowness.slowness_file(cluster.work_dir, host))
        if host not in seen:
            raise RuntimeError(
                f"no probe task ran on {host} in {PROBE_ROUNDS} rounds (they ran on "
                f"{sorted(seen)}): its executor takes no pinned task"
            )
        path, factor = seen[host]
        if path != want:
            raise RuntimeError(
                f"tasks on {host} read slowness from {path!r}, not {want!r}: the cluster was "
                "started without it; stop it (`tailguard cluster --work-dir DIR down`) and rerun"
            )
        if factor != 1.0:
            raise RuntimeError(f"{host} is still slowed (factor {factor:g}) before the run")


def speculation_latency_rows(records: list[r.Record]) -> list[dict[str, Any]]:
    return [
        {
            "vertex": s.vertex,
            "subtask": s.subtask,
            "to_answered": s.to_answered_ms,
            "to_applied": s.to_applied_ms,
            "to_deploying": s.to_deploying_ms,
        }
        for s in report.speculation_latencies(records)
    ]


def _speculation_defaults(spark: Any) -> dict[str, str]:
    """Spark's own defaults of the speculation keys, read from the running JVM."""
    out: dict[str, str] = {}
    jvm = spark.sparkContext._jvm
    try:
        entries = jvm.org.apache.spark.internal.config.ConfigEntry.findEntry
        for key in SPECULATION_KEYS:
            entry = entries(key)
            out[key] = str(entry.defaultValueString()) if entry is not None else "?"
    except Exception as err:  # only informative; never fail a run for it
        out["error"] = str(err)[:200]
    return out


@contextlib.contextmanager
def _quiet_spark_logs() -> Iterator[None]:
    # Plain sessions lack tailguard's attempt confs, which SparkRuntime (used by
    # await_executors) warns about; expected here.
    logger = logging.getLogger("tailguard.agent.spark")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _control_plane_pids(up_: Any) -> dict[str, int]:
    """The broker's and the services' processes by name: the control plane whose CPU a run
    reports."""
    pids = {"broker": up_.broker.pid} if up_.broker is not None else {}
    if up_.services is not None:
        pids |= {name: service.pid for name, service in up_.services.running().items()}
    return pids
