"""`tailguard.attach` on the plugin's local[2] session and broker: commands written to
`tailguard.commands` for an attached application's running Spark job reach Spark's scheduler
through the relay and the JVM actuator, and each is answered in the application's archive.

`local[2]` is one host, so a copy or a block has nowhere to go there and must be refused with
that reason; a restart kills the running attempt and Spark re-runs it; a FailJob cancels the
Spark job with its reason. The multi-host behaviour is the cluster test's (test_attach_cluster)."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer

import tailguard
from tailguard.archive import ArchiveReader
from tailguard.codec import codec_for
from tailguard.kafka.signing import KEY_SETTING, RecordSigner, signing_keys
from tailguard.model import records as r
from tailguard.model.config import Settings
from tailguard.observer.translate import observed_job_id, stage_vertex

pytestmark = [pytest.mark.spark]


def _settings(tmp_path: Path, bootstrap: str) -> dict[str, str]:
    return {
        "bootstrap.servers": bootstrap,
        "tailguard.archive-dir": str(tmp_path / "archive"),
        "tailguard.work-dir": str(tmp_path / "work"),
    }


def _wait_for(condition: Callable[[], Any], what: str, timeout_s: float = 60.0) -> Any:
    # Spark's status tracker has no notification to wait on: it is polled, as Spark's UI does.
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class RunningJob:
    """A Spark job in a thread of its own, its tasks waiting `task_s` each; each task marks its
    start with a file in `marks`."""

    def __init__(self, spark: Any, group: str, partitions: int, task_s: float, marks: Path) -> None:
        self.sc = spark.sparkContext
        self.group = group
        self.marks = marks
        marks.mkdir(parents=True)
        self.result: list[int] | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(partitions, task_s), daemon=True)
        self._thread.start()

    def _run(self, partitions: int, task_s: float) -> None:
        marks = str(self.marks)

        def work(index: int, rows: Iterator[int]) -> Iterator[int]:
            Path(marks, f"started-{index}").touch()
            # The task's work: a wait, as I/O-bound work is, cut short when the test releases it.
            release, deadline = Path(marks, "release"), time.monotonic() + task_s
            while not release.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            yield sum(rows)

        self.sc.setJobGroup(self.group, self.group)
        try:
            rdd = self.sc.parallelize(range(100), partitions)
            self.result = rdd.mapPartitionsWithIndex(work).collect()
        except BaseException as err:
            self.error = err
        finally:
            if self.sc._jsc is not None:  # the session is shared: leave no group behind
                self.sc.setLocalProperty("spark.jobGroup.id", None)
                self.sc.setLocalProperty("spark.job.description", None)

    def spark_job(self) -> int:
        return int(
            _wait_for(lambda: self.sc.statusTracker().getJobIdsForGroup(self.group), "job")[0]
        )

    def running_stage(self, tasks: int) -> int:
        """The job's one stage, once `tasks` of its tasks have started."""
        _wait_for(lambda: len(list(self.marks.iterdir())) >= tasks, "the tasks to start")
        info = self.sc.statusTracker().getJobInfo(self.spark_job())
        return int(info.stageIds[0])

    def release(self) -> None:
        """Let the running tasks finish now."""
        (self.marks / "release").touch()

    def join(self, timeout_s: float = 120.0) -> None:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "the job did not end"


def _nonempty(seq: Any) -> Any:
    """A Scala sequence if it has elements, else None (py4j objects are always true)."""
    return seq if seq.size() > 0 else None


def _send(
    bootstrap: str, settings: Settings, *commands: r.Command, signer: str | None = None
) -> None:
    """Write `commands` to the commands topic, unsigned, or signed as `signer` with the
    settings' key."""
    codec = codec_for(settings)
    producer = Producer({"bootstrap.servers": bootstrap})
    for command in commands:
        value = codec.encode(command)
        headers = []
        if signer is not None:
            key, _ = signing_keys(settings)
            assert key is not None
            headers = RecordSigner(key, signer).headers(r.COMMANDS_TOPIC, value)
        producer.produce(r.COMMANDS_TOPIC, value, command.job_id.encode(), headers=headers)
    assert producer.flush(10) == 0


def _attached_job(
    spark: Any, settings: dict[str, str], group: str, task_s: float, marks: Path
) -> tuple[Any, RunningJob, str, int]:
    """An attachment, and a job of two tasks running under it: its tailguard id and stage."""
    attachment = tailguard.attach(spark, settings)
    job = RunningJob(spark, group, 2, task_s=task_s, marks=marks)
    spark_job, stage = job.spark_job(), job.running_stage(tasks=2)
    return attachment, job, observed_job_id(attachment.app_id, spark_job), stage


def _await_outcomes(bootstrap: str, settings: Settings, job_id: str, count: int) -> None:
    """Until `count` commands of `job_id` are answered on the events topic (the relay
    publishes each CommandApplied / CommandRejected there as it happens)."""
    codec = codec_for(settings)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-outcomes-{job_id}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([r.EVENTS_TOPIC])
    answered: set[str] = set()
    deadline = time.monotonic() + 120
    try:
        while len(answered) < count:
            assert time.monotonic() < deadline, f"answered only {answered}"
            message = consumer.poll(0.5)
            if message is None or message.error() or message.key() != job_id.encode():
                continue
            record = codec.decode(message.value())
            if isinstance(record, (r.CommandApplied, r.CommandRejected)):
                answered.add(record.command_id)
    finally:
        consumer.close()


def _archived(tmp_path: Path, app_id: str) -> list[r.Record]:
    return [e.record for e in ArchiveReader(tmp_path / "archive" / f"{app_id}.avro")]


def _outcomes(records: list[r.Record]) -> dict[str, str]:
    out: dict[str, str] = {}
    for x in records:
        if isinstance(x, r.CommandApplied):
            out[x.command_id] = "applied"
        elif isinstance(x, r.CommandRejected):
            out[x.command_id] = x.reason
    return out


def test_commands_for_a_running_job_are_applied_or_refused_with_their_reason(
    tailguard_local_spark: Any, tailguard_broker: Any, tmp_path: Path
) -> None:
    spark = tailguard_local_spark
    settings = _settings(tmp_path, tailguard_broker.bootstrap)
    attachment, job, job_id, stage = _attached_job(
        spark, settings, "attach-fail", 120, tmp_path / "marks"
    )
    try:
        now = int(time.time() * 1000)
        # The host Spark's tasks report (local[N]: the driver's), as the relay names it; the
        # executor list's host can differ (Spark 3.5 names local tasks by canonical host name).
        store = spark.sparkContext._jsc.sc().statusStore()
        tasks = _wait_for(lambda: _nonempty(store.taskList(stage, 0, 1)), "the tasks' data")
        host = tasks.apply(0).host()
        copy = r.LaunchSpeculativeAttempts(
            job_id=job_id,
            ts=now,
            id="speculator-t1",
            vertex=stage_vertex(stage),
            subtask=0,
            count=1,
        )
        every_host = r.BlockNodes(
            job_id=job_id, ts=now, id="blocklist-t1", hosts=(host,), until_ts=now + 60_000
        )
        fail = r.FailJob(job_id=job_id, ts=now, id="failover-t1", reason="too many restarts")
        _send(tailguard_broker.bootstrap, Settings(settings), copy, every_host, fail)
        job.join()
    finally:
        assert attachment.close() == 0

    assert job.error is not None and "tailguard FailJob failover-t1" in str(job.error)
    outcomes = _outcomes(_archived(tmp_path, attachment.app_id))
    assert outcomes["failover-t1"] == "applied"
    assert "can run a copy" in outcomes["speculator-t1"]
    assert "would block the last usable hosts" in outcomes["blocklist-t1"]


def test_a_restart_kills_the_attempt_and_spark_runs_it_again(
    tailguard_local_spark: Any, tailguard_broker: Any, tmp_path: Path
) -> None:
    spark = tailguard_local_spark
    settings = _settings(tmp_path, tailguard_broker.bootstrap)
    attachment, job, job_id, stage = _attached_job(
        spark, settings, "attach-restart", 120, tmp_path / "marks"
    )
    try:
        restart = r.RestartTasks(
            job_id=job_id,
            ts=int(time.time() * 1000),
            id="failover-t2",
            tasks=(r.TaskRef(stage_vertex(stage), 0),),
            reason="its input was lost",
            not_before_ts=0,
        )
        _send(tailguard_broker.bootstrap, Settings(settings), restart)
        _await_outcomes(tailguard_broker.bootstrap, Settings(settings), job_id, 1)
        job.release()  # the re-run, and the other task, finish at once
        job.join()
    finally:
        job.release()
        assert attachment.close() == 0

    assert job.error is None and job.result == [sum(range(50)), sum(range(50, 100))]
    records = _archived(tmp_path, attachment.app_id)
    assert _outcomes(records)["failover-t2"] == "applied"
    attempts = [
        (x.subtask, x.attempt)
        for x in records
        if isinstance(x, r.AttemptDeploying) and x.job_id == job_id
    ]
    assert (0, 1) in attempts, attempts  # the killed attempt ran again
    canceled = [x for x in records if isinstance(x, r.AttemptCanceled) and x.job_id == job_id]
    assert [(x.subtask, x.attempt) for x in canceled] == [(0, 0)]


def test_with_no_broker_the_application_runs_as_if_unattached_with_one_warning(
    tailguard_local_spark: Any, tmp_path: Path
) -> None:
    spark = tailguard_local_spark
    # The relay is the JVM's child and writes to the JVM's stderr: keep its own apart.
    relay_log = tmp_path / "relay.log"
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@" 2>>{relay_log}\n')
    python.chmod(0o755)
    attachment = tailguard.attach(spark, _settings(tmp_path, "127.0.0.1:9"), python=str(python))
    try:
        rows = spark.sparkContext.parallelize(range(1_000), 8).map(lambda x: x % 3).countByValue()
    finally:
        assert attachment.close() == 0
    assert dict(rows) == {0: 334, 1: 333, 2: 333}
    said = relay_log.read_text()
    warnings = [line for line in said.splitlines() if "no broker answered within" in line]
    assert len(warnings) == 1 and "runs as if unattached" in warnings[0], said
    assert "rdkafka" not in said  # no reconnect noise either
    records = _archived(tmp_path, attachment.app_id)  # the audit log is kept all the same
    assert any(isinstance(x, r.AttemptFinished) for x in records)


def test_with_signing_on_forged_commands_are_refused_and_the_output_is_exact(
    tailguard_local_spark: Any, tailguard_broker: Any, tmp_path: Path
) -> None:
    """The relay checks each command as the owned driver does: an unsigned FailJob, and one
    signed with the key by a sender without the authority, are rejected with the reason; the
    job runs to its exact result."""
    spark = tailguard_local_spark
    settings = {
        **_settings(tmp_path, tailguard_broker.bootstrap),
        KEY_SETTING: "attach-forged-commands-key-0123456789",
    }
    attachment, job, job_id, _ = _attached_job(
        spark, settings, "attach-forged", 120, tmp_path / "marks"
    )
    try:
        now = int(time.time() * 1000)
        unsigned = r.FailJob(job_id=job_id, ts=now, id="failover-f1", reason="forged")
        no_authority = r.FailJob(job_id=job_id, ts=now, id="failover-f2", reason="forged")
        _send(tailguard_broker.bootstrap, Settings(settings), unsigned)
        _send(tailguard_broker.bootstrap, Settings(settings), no_authority, signer="speculator")
        # Both answered while the job runs; then its tasks may finish.
        _await_outcomes(tailguard_broker.bootstrap, Settings(settings), job_id, 2)
        job.release()
        job.join()
    finally:
        job.release()
        assert attachment.close() == 0

    assert job.error is None and job.result == [sum(range(50)), sum(range(50, 100))]
    outcomes = _outcomes(_archived(tmp_path, attachment.app_id))
    assert "sign" in outcomes["failover-f1"], outcomes
    assert "speculator" in outcomes["failover-f2"], outcomes
