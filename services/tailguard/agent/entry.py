"""`tailguard.run(job, spark)`: run a job graph on a Spark cluster under the control plane."""

from __future__ import annotations

import functools
import logging
import queue
import socket
import threading
import time
from pathlib import Path
from typing import Any

from tailguard import filesystems
from tailguard.agent.driver.driver import JobDriver, RunOptions, new_job_id
from tailguard.agent.driver.hooks import JobHooks
from tailguard.agent.driver.options import runner_wait
from tailguard.agent.driver.ports import (
    AgentThreadFailed,
    CommandReceived,
    InboxMessage,
    Publisher,
)
from tailguard.agent.driver.recovery import JobLog, RecoveryError, check_recoverable
from tailguard.agent.driver.result import RunResult
from tailguard.agent.executor import partitions
from tailguard.agent.executor.storage import Storage
from tailguard.agent.graph.api import Job
from tailguard.archive import ArchiveWriter, archive_exists
from tailguard.kafka.decision_reader import start_margin_ms
from tailguard.logs import hide_secrets, job_context
from tailguard.model import records as r
from tailguard.model.authority import Unauthentic
from tailguard.model.config import SERVICES_KEY, Settings, parse_duration_ms

log = logging.getLogger(__name__)

LOG_MODES = ("kafka", "archive")
# How often a remote archive's new records are uploaded: the most a lost driver can lose.
ARCHIVE_UPLOAD_INTERVAL = "tailguard.archive.upload-interval"
DEFAULT_ARCHIVE_UPLOAD_INTERVAL = "10 s"
# How far before its first fact a job's agent starts reading decisions: the most the clocks of
# the services' hosts may lag the driver's (a command is stamped by the service that made it).


class JobIdInUse(ValueError):
    """A job id that has run before: its archive exists."""


def run(
    job: Job,
    spark: Any,
    *,
    log_mode: str = "kafka",
    services: bool = True,
    settings: Settings | None = None,
    storage: str | None = None,
    job_id: str | None = None,
    progress: bool = True,
    hooks: JobHooks | None = None,
    recover: str | None = None,
) -> RunResult:
    """Run `job` on the cluster behind `spark` (a SparkSession) and return its result.

    - `log_mode="kafka"` publishes every fact to Kafka (the configured broker, or the embedded
      one found in the work directory) and applies the services' decisions; `"archive"` keeps
      the facts in the archive only and decides everything locally.
    - `services=False` does not wait for the services: the local fallbacks decide at once.
    - `storage` is where result partitions live (a path or a `pyarrow.fs` URI such as
      `s3://bucket/tailguard`; default `<work-dir>/storage`). Every executor must reach it.
    The per-job Avro archive (`<archive-dir>/<job id>.avro`) is written in both modes;
    `tailguard.archive-dir` may be a URI too (docs/storage.md: what a lost driver loses then).
    S3 is reached with the `s3.*` settings or the AWS default chain.
    `hooks` reach into the running job (tests and chaos cases: `JobHooks`).
    `recover=JOB_ID` takes over a job whose driver died (the same `job`, settings and storage):
    its state is rebuilt from its archive and the topics, finished results that still verify are
    kept, the rest runs again (docs/reliability.md#driver-recovery); `RecoveryError` when it
    cannot be, before anything is recorded.
    The job's metrics are served while it runs when `tailguard.metrics.port` is set, and pushed
    at its end when `tailguard.metrics.pushgateway` is (docs/operations.md#metrics); its log
    lines name its id (docs/operations.md#logs).
    """
    from tailguard.agent.adapters import metrics
    from tailguard.agent.adapters.spark import SparkRuntime
    from tailguard.codec import codec_for
    from tailguard.settings_file import load_settings

    if log_mode not in LOG_MODES:
        raise ValueError(f"log_mode must be one of {LOG_MODES}, not {log_mode!r}")
    job.validate()
    settings = settings or load_settings()
    hide_secrets(settings)  # from the lines of a `tailguard.logs` handler, if one is installed
    s3 = filesystems.configure_from(settings)
    if s3 is not None:
        log.info("S3 %r, credentials from %s", s3, s3.credentials)
    work_dir = Path(settings.get("tailguard.work-dir") or "work")
    archive_dir = settings.get("tailguard.archive-dir") or str(work_dir / "archive")
    store = Storage(storage or str(work_dir / "storage"))
    if recover is not None:
        if job_id not in (None, recover):
            raise ValueError(f"recover={recover!r} runs job {recover}, not job_id={job_id!r}")
        job_id = recover
        refuse_running_driver(store, recover)
    elif job_id is not None:  # a new id is new
        refuse_used_job_id(archive_dir, job_id)
    job_id = job_id or new_job_id(job)
    # This process owns the job's tree from here on; marked before the sweep, which would take a
    # dead driver's results (the job being recovered) for leftovers.
    partitions.mark_job_running(store, job_id, partitions.JobOwner.current())
    swept = partitions.sweep_abandoned(store, partitions.local_owner_alive)
    if swept:
        log.info("swept the leftovers of %d crashed job(s): %s", len(swept), ", ".join(swept))

    # Every line logged from here on names the job (docs/operations.md#logs).
    with job_context(job_id):
        job_metrics = metrics.JobMetrics(metrics.process_metrics(), job_id, job.name)
        # Before anything starts: a port that cannot be had stops the job here, naming the setting.
        metrics_url = metrics.serve_endpoint(settings, job_metrics.metrics)
        if metrics_url is not None:
            log.info("job %s: metrics at %s", job_id, metrics_url)
        archive_location = filesystems.join(filesystems.normalise(archive_dir), f"{job_id}.avro")
        recovering = None
        if recover is not None:
            from tailguard.agent.adapters.job_log import read_recovery_log

            recovering = read_recovery_log(
                job_id, archive_location, settings, topics=log_mode == "kafka"
            )
            settings = recorded_policy(settings, recovering.job_log)
        archive = ArchiveWriter(
            archive_location,
            upload_interval_s=parse_duration_ms(
                settings.get(ARCHIVE_UPLOAD_INTERVAL) or DEFAULT_ARCHIVE_UPLOAD_INTERVAL
            )
            / 1000.0,
            spool_dir=work_dir / "archive-spool",
        )
        if recovering is not None:
            # The archive gets the whole log: what only the topic kept goes in before the new.
            for event in recovering.not_archived:
                archive.append(r.EVENTS_TOPIC, "published", event, event.ts)
            for item in recovering.decisions_not_archived:
                archive.append(item.topic, "received", item.record, item.record.ts)
        codec = codec_for(settings)
        use_services = services and log_mode == "kafka"
        min_ratio, max_wait_s = runner_wait(settings)
        options = RunOptions(
            services=use_services,
            storage=store,
            progress=progress,
            runners_min_ratio=min_ratio,
            runners_max_wait_s=max_wait_s,
        )
        if use_services:
            from tailguard.blocklist.fleet_topic import read_changes

            options.fleet_list = functools.partial(read_changes, settings)

        # The driver's inbox exists before the consumer thread that feeds it starts.
        inbox: queue.Queue[InboxMessage] = queue.Queue()

        def thread_failed(error: BaseException) -> None:
            inbox.put(AgentThreadFailed(threading.current_thread().name, error))

        def deliver(command: CommandReceived) -> None:
            if not isinstance(command.origin, Unauthentic):  # a forged timestamp proves nothing
                job_metrics.command_received(command.command, int(time.time() * 1000))
            inbox.put(command)

        publisher: Publisher
        if log_mode == "kafka":
            from tailguard.agent.adapters.kafka import KafkaPublisher

            # The job's decisions are read from its first fact on (a recovered job's: from the
            # dead driver's), less a margin for the clocks of the services' hosts.
            first_fact_ms = recovering.job_log.events[0].ts if recovering is not None else _now_ms()
            publisher = KafkaPublisher(
                archive,
                codec,
                settings,
                job_id,
                deliver,
                start_at_ms=first_fact_ms - start_margin_ms(settings),
                on_failure=thread_failed,
            )
        else:
            from tailguard.archive.publisher import ArchivePublisher

            publisher = ArchivePublisher(archive, codec)
        runtime = SparkRuntime(spark, settings, job_name=job.name)
        metered = metrics.MeteredPublisher(publisher, job_metrics)
        driver = JobDriver(
            job,
            runtime,
            metered,
            settings,
            options,
            job_id=job_id,
            inbox=inbox,
            recover=recovering.job_log if recovering is not None else None,
            hooks=hooks,
        )
        try:
            # The job's own threads report their death to its inbox alone: the decision reader
            # here, the runner threads in `SparkRuntime.start_thread`.
            result = driver.run()
        finally:
            # The publisher is closed (late decisions drained): the job's series are complete.
            metrics.push(settings, job_metrics)
            job_metrics.close()
        if metrics_url is not None:
            result.extra["metrics_url"] = metrics_url
        return result


def refuse_running_driver(store: Storage, job_id: str) -> None:
    """RecoveryError if the job's driver still runs: only a job whose driver died is taken over."""
    owner = partitions.read_job_owner(store, job_id)
    # A driver on another host cannot be judged from here: recovering says it died.
    here = socket.gethostname()
    if owner is not None and owner.host == here and partitions.local_owner_alive(owner, here):
        raise RecoveryError(
            f"job {job_id} is still run by process {owner.pid} on {owner.host}: only a job "
            "whose driver died can be recovered"
        )


def recorded_policy(settings: Settings, job_log: JobLog) -> Settings:
    """The settings of a recovered run: the policy settings the job was submitted with win, so
    the agent's local cores decide as the services do (they read them from JobSubmitted)."""
    submitted = check_recoverable(job_log)
    recorded = {k: v for k, v in submitted.config.items() if k != SERVICES_KEY}
    return Settings({**settings.overrides(), **recorded})


def refuse_used_job_id(archive_dir: str, job_id: str) -> None:
    """`JobIdInUse` if a job ran under `job_id` before (its archive exists): a new run would
    append itself to that job's archive, and replay would compare two runs as one."""
    location = filesystems.join(filesystems.normalise(archive_dir), f"{job_id}.avro")
    if archive_exists(location):
        raise JobIdInUse(
            f"job id {job_id!r} has run before (its archive {location} exists): run the job "
            f"under a new id, or take over the run whose driver died with "
            f"`tailguard run --recover {job_id}` (Python: tailguard.run(..., recover={job_id!r}))"
        )


def _now_ms() -> int:
    return int(time.time() * 1000)
