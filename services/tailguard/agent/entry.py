"""`tailguard.run(job, spark)`: run a job graph on a Spark cluster under the control plane."""

from __future__ import annotations

import functools
import logging
import queue
import time
from pathlib import Path
from typing import Any

from tailguard import filesystems
from tailguard.agent.driver.driver import JobDriver, RunOptions, new_job_id
from tailguard.agent.driver.ports import CommandReceived, InboxMessage, Publisher
from tailguard.agent.driver.result import RunResult
from tailguard.agent.executor import partitions
from tailguard.agent.executor.storage import Storage
from tailguard.agent.graph.api import Job
from tailguard.log.archive import ArchiveWriter
from tailguard.logs import hide_secrets, job_context
from tailguard.model.authority import Unauthentic
from tailguard.model.config import Settings, parse_duration_ms

log = logging.getLogger(__name__)

LOG_MODES = ("kafka", "archive")
# How often a remote archive's new records are uploaded: the most a lost driver can lose.
ARCHIVE_UPLOAD_INTERVAL = "tailguard.archive.upload-interval"
DEFAULT_ARCHIVE_UPLOAD_INTERVAL = "10 s"


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
    options: RunOptions | None = None,
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
    swept = partitions.sweep_abandoned(store, partitions.local_owner_alive)
    if swept:
        log.info("swept the leftovers of %d crashed job(s): %s", len(swept), ", ".join(swept))

    job_id = job_id or new_job_id(job)
    # Every line logged from here on names the job (docs/operations.md#logs).
    with job_context(job_id):
        job_metrics = metrics.JobMetrics(metrics.process_metrics(), job_id, job.name)
        # Before anything starts: a port that cannot be had stops the job here, naming the setting.
        metrics_url = metrics.serve_endpoint(settings, job_metrics.metrics)
        if metrics_url is not None:
            log.info("job %s: metrics at %s", job_id, metrics_url)
        archive = ArchiveWriter(
            filesystems.join(filesystems.normalise(archive_dir), f"{job_id}.avro"),
            upload_interval_s=parse_duration_ms(
                settings.get(ARCHIVE_UPLOAD_INTERVAL) or DEFAULT_ARCHIVE_UPLOAD_INTERVAL
            )
            / 1000.0,
            spool_dir=work_dir / "archive-spool",
        )
        codec = codec_for(settings)
        options = options or RunOptions()
        options.storage = store
        options.progress = progress
        use_services = services and log_mode == "kafka"
        options.services = use_services
        if use_services and options.fleet_list is None:
            from tailguard.log.fleet_topic import read_changes

            options.fleet_list = functools.partial(read_changes, settings)

        # The driver's inbox exists before the consumer thread that feeds it starts.
        inbox: queue.Queue[InboxMessage] = queue.Queue()

        def deliver(command: CommandReceived) -> None:
            if not isinstance(command.origin, Unauthentic):  # a forged timestamp proves nothing
                job_metrics.command_received(command.command, int(time.time() * 1000))
            inbox.put(command)

        publisher: Publisher
        if log_mode == "kafka":
            from tailguard.agent.adapters.kafka import KafkaPublisher

            publisher = KafkaPublisher(archive, codec, settings, job_id, deliver)
        else:
            from tailguard.agent.adapters.kafka import ArchivePublisher

            publisher = ArchivePublisher(archive, codec)
        runtime = SparkRuntime(spark, settings, job_name=job.name)
        metered = metrics.MeteredPublisher(publisher, job_metrics)
        driver = JobDriver(job, runtime, metered, settings, options, job_id=job_id, inbox=inbox)
        partitions.mark_job_running(store, job_id, partitions.JobOwner.current())
        try:
            result = driver.run()
        finally:
            # The publisher is closed (late decisions drained): the job's series are complete.
            metrics.push(settings, job_metrics)
            job_metrics.close()
        if metrics_url is not None:
            result.extra["metrics_url"] = metrics_url
        return result
