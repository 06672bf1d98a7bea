"""The faults the chaos cases inject, each at a moment given by an event of the job.

`FIRST_HEAD_FINISH`-style triggers are events the driver has just published; see
`toolkit.Fault` for what runs on the driver's thread and what in the fault's own thread.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.chaos.toolkit import HEAD, Fault
from tests.driver_inbox import wait_until_received

from tailguard.agent.executor.partitions import partition_dir
from tailguard.broker.embedded import EmbeddedBroker
from tailguard.codec import codec_for
from tailguard.kafka.dead_letters import dlq_topic
from tailguard.kafka.producer import RecordProducer
from tailguard.model import records as r
from tailguard.model.authority import UNAUTHENTICATED_COMMANDS_TOPIC
from tailguard.model.ids import derived_id
from tailguard.processes import trees
from tailguard.testing import Broker, Services

# The prefix of every record id a forging case makes up: replay flags such records as
# unattributed (no service emits them), which is right, and the case counts them apart.
FORGED = "chaos-forged"


def head_finished(event: r.Event) -> bool:
    return isinstance(event, r.AttemptFinished) and event.vertex == HEAD


def finished(vertex: str, subtask: int) -> Callable[[r.Event], bool]:
    def matches(event: r.Event) -> bool:
        return isinstance(event, r.AttemptFinished) and (event.vertex, event.subtask) == (
            vertex,
            subtask,
        )

    return matches


def any_finished(event: r.Event) -> bool:
    return isinstance(event, r.AttemptFinished)


# ---------------------------------------------------------------------- processes


class ServiceKills(Fault):
    """kill -9 of one service, `times` times in one job, each time restarted as an operator
    would (`tailguard services up` starts what is not running): the supervisor does not restart
    a dead service by itself. The first kill comes at the first finished attempt, each next one
    at the first finished attempt after the restart before it was ready."""

    def __init__(self, services: Services, name: str, times: int = 2) -> None:
        super().__init__()
        self.services, self.name, self.times = services, name, times
        self._busy = False

    def on_event(self, event: r.Event) -> None:
        if self._busy or self.injected >= self.times or not any_finished(event):
            return
        self._busy = True
        self.injected += 1
        self.background(self._kill_and_restart)

    def _kill_and_restart(self) -> None:
        began = time.monotonic()
        self.services.kill(self.name)
        self.services.start([self.name])  # returns once it reports ready
        self.recoveries.append(time.monotonic() - began)
        self._busy = False


class BrokerKill(Fault):
    """kill -9 of the embedded broker at the first finished attempt, restarted at once the way
    an operator would (`tailguard broker up` on the same work dir). Recovery: kill to the
    restarted broker's ready, and the services healthy on it again."""

    def __init__(self, broker: Broker, services: Services, wait_healthy_s: float = 60.0) -> None:
        super().__init__()
        self.broker, self.services = broker, services
        self.wait_healthy_s = wait_healthy_s
        self.restarted: EmbeddedBroker | None = None
        self.new_pid: int | None = None

    def on_event(self, event: r.Event) -> None:
        if self.injected or not head_finished(event):
            return
        self.injected = 1
        self.background(self._kill_and_restart)

    def _kill_and_restart(self) -> None:
        embedded = EmbeddedBroker(self.broker.work_dir)
        state = embedded.status()
        assert state is not None, "no broker running to kill"
        began = time.monotonic()
        os.kill(state.pid, signal.SIGKILL)
        if not trees.wait_gone([state.pid], 10.0):
            raise RuntimeError(f"broker pid {state.pid} alive after SIGKILL")
        bootstrap = embedded.start()
        restarted = embedded.status()
        self.restarted, self.new_pid = embedded, restarted.pid if restarted else None
        self.recoveries.append(time.monotonic() - began)
        same = bootstrap == self.broker.bootstrap
        self.notes.append(
            "restarted on the same address"
            if same
            else f"restarted on a new address ({self.broker.bootstrap} -> {bootstrap}): clients "
            "configured with the old one cannot reach it"
        )
        deadline = time.monotonic() + self.wait_healthy_s
        unhealthy = set(self.services.names)
        while unhealthy and time.monotonic() < deadline:
            running = self.services.running()
            unhealthy = {n for n in unhealthy if n not in running or not running[n].healthy()}
            threading.Event().wait(0.5)  # /health has no event to wait on: poll it
        if unhealthy:
            self.notes.append(f"not healthy {self.wait_healthy_s:.0f} s later: {sorted(unhealthy)}")


def executor_jvm(worker_pid: int) -> int | None:
    """The executor JVM a Spark worker launched (its child running the executor backend)."""
    for pid in trees.descendants(worker_pid)[1:]:
        if "CoarseGrainedExecutorBackend" in trees.cmdline(pid):
            return pid
    return None


class HostProcessKill(Fault):
    """kill -9, mid-attempt, of what runs a live attempt on a host: the whole Spark worker
    (`what="worker"`: the worker, its executor and the Python workers, a lost machine), or only
    its executor JVM (`what="executor"`, found among the worker's children by its command
    line). At the first finished attempt, on the host of an attempt that is still running.
    Recovery: to the killed subtask's next finished attempt."""

    def __init__(self, cluster: Any, what: str) -> None:
        super().__init__()
        self.cluster, self.what = cluster, what
        self.victim: tuple[str, int, str] | None = None

    def on_event(self, event: r.Event) -> None:
        if self.injected or not any_finished(event) or self.driver is None:
            return
        live = self.driver.state.live_attempts()
        if not live:
            return
        attempt = live[0]
        root = self.cluster.worker(attempt.host).pid
        if self.what == "worker":
            victims = trees.descendants(root)
        else:
            jvm = executor_jvm(root)
            if jvm is None:
                self.notes.append(f"no executor JVM under the worker of {attempt.host}")
                return
            victims = [jvm]
        began = time.monotonic()
        trees.signal_all(victims, signal.SIGKILL)
        self.injected = 1
        self.victim = (attempt.vertex, attempt.subtask, attempt.host)
        self.notes.append(
            f"killed the {self.what} of {attempt.host} under {attempt.vertex}#{attempt.subtask}"
        )
        self.recovered_when(finished(attempt.vertex, attempt.subtask), began)


# ---------------------------------------------------------------------- result partitions


class PartitionDamage(Fault):
    """The first finished partition of the head chain deleted (`how="delete"`) or its files
    overwritten with garbage in the middle (`how="corrupt"`), on the driver's thread before it
    schedules anything: the consumers read only once every head subtask has finished, so the
    damage is there before anyone reads. Recovery: to the damaged subtask's re-production."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how

    def on_event(self, event: r.Event) -> None:
        if self.injected or not head_finished(event) or self.driver is None:
            return
        assert isinstance(event, r.AttemptFinished)
        ref = r.PartitionRef(event.vertex, event.subtask, event.attempt)
        directory = partition_dir(self.driver.storage, self.driver.job_id, ref)
        if self.how == "delete":
            shutil.rmtree(directory)
        else:
            damaged = [f for f in sorted(Path(directory).rglob("*")) if f.is_file()]
            data_files = [f for f in damaged if f.stat().st_size > 64]
            for path in data_files:
                with path.open("r+b") as handle:
                    handle.seek(path.stat().st_size // 2)
                    handle.write(b"\xde\xad\xbe\xef" * 8)
            self.notes.append(f"corrupted {len(data_files)} file(s) of {HEAD}#{event.subtask}")
        self.injected = 1

        def reproduced(later: r.Event) -> bool:
            return (
                finished(ref.vertex, ref.subtask)(later)
                and isinstance(later, r.AttemptFinished)
                and later.attempt != ref.attempt
            )

        self.recovered_when(reproduced, time.monotonic())


# ---------------------------------------------------------------------- garbage on the topics


def every_topic(settings: dict[str, str]) -> list[str]:
    """The topics tailguard defines (events, findings, commands, their dead letters, the
    unauthenticated-commands name, the fleet blocklist) and any other the broker holds now."""
    from confluent_kafka.admin import AdminClient

    from tailguard.model.fleet import BLOCKLIST_TOPIC

    defined = [
        *r.TOPICS,
        *(dlq_topic(t) for t in r.TOPICS),
        UNAUTHENTICATED_COMMANDS_TOPIC,
        BLOCKLIST_TOPIC,
    ]
    admin = AdminClient({"bootstrap.servers": settings["bootstrap.servers"]})
    present = admin.list_topics(timeout=10).topics
    return sorted(set(defined) | {t for t in present if not t.startswith("__")})


def undecodable(codec: Any, valid: r.Record) -> list[bytes]:
    """Bytes no reader can decode: noise, the single-object marker with an unknown schema
    fingerprint, a valid record cut short, and nothing at all."""
    encoded = codec.encode(valid)
    return [b"\x00chaos garbage\xff", b"\xc3\x01" + b"\x13" * 8 + b"junk", encoded[:-3], b""]


def invalid_records(job_id: str, ts: int, hosts: list[str]) -> list[r.Record]:
    """Well-formed records that make no sense for the job: unknown vertices and subtasks, an
    attempt that never ran, hosts that are not the job's, impossible counts, and a finding and
    a command for a job that does not exist."""

    def fields(name: str, job: str = job_id) -> dict[str, Any]:
        return {"job_id": job, "ts": ts, "id": derived_id(FORGED, job, name)}

    ghost = "chaos-no-such-job"
    return [
        r.AttemptFinished(
            vertex="no-such-vertex",
            subtask=0,
            attempt=0,
            host=hosts[0],
            input_bytes=1,
            records=1,
            bytes_per_subpartition=(1,),
            checksums=("x",),
            **fields("finished-unknown-vertex"),
        ),
        r.AttemptFinished(
            vertex=HEAD,
            subtask=999,
            attempt=7,
            host="10.9.9.9",
            input_bytes=-5,
            records=-1,
            bytes_per_subpartition=(),
            checksums=(),
            **fields("finished-unknown-subtask"),
        ),
        r.AttemptFailed(
            vertex=HEAD,
            subtask=998,
            attempt=0,
            host="10.9.9.9",
            error=r.ErrorKind.NODE_LOST,
            message="forged",
            **fields("failed-unknown-subtask"),
        ),
        r.NodeAdded(host="10.9.9.9", slots=-3, **fields("node-negative-slots")),
        r.SlowTasksDetected(
            vertex="no-such-vertex",
            speculation_safe=True,
            baseline_ms=-1,
            baseline_ns_per_byte=None,
            hosts=("10.9.9.9",),
            slow=(
                r.SlowSubtask(
                    subtask=42,
                    latest_attempt=9,
                    live_attempts=(
                        r.SlowAttempt(attempt=9, host="10.9.9.9", execution_time_ms=-1),
                    ),
                ),
            ),
            **fields("finding-unknown-vertex"),
        ),
        r.SlowTasksDetected(
            vertex=HEAD,
            speculation_safe=True,
            baseline_ms=1,
            hosts=(),
            baseline_ns_per_byte=None,
            slow=(),
            **fields("finding-ghost", ghost),
        ),
        r.SetParallelism(
            vertex="no-such-vertex",
            parallelism=0,
            subtask_inputs=(),
            **fields("set-unknown-vertex"),
        ),
        r.LaunchSpeculativeAttempts(vertex=HEAD, subtask=999, count=0, **fields("spec-bad")),
        r.BlockNodes(hosts=("10.9.9.9",), until_ts=ts - 1, **fields("block-unknown-host")),
        r.UnblockNodes(hosts=("10.9.9.8",), **fields("unblock-unknown-host")),
        r.RestartTasks(
            tasks=(r.TaskRef("no-such-vertex", 3),),
            reason="forged",
            not_before_ts=0,
            **fields("restart-unknown-vertex"),
        ),
        r.SetParallelism(
            vertex=HEAD, parallelism=1, subtask_inputs=(), **fields("set-ghost", ghost)
        ),
    ]


class ForgedRecords(Fault):
    """At the first finished attempt: undecodable bytes on every topic (`every_topic`, keyed by
    the job's id, so they land in the job's partition), then well-formed but invalid events,
    findings and commands on their topics (`invalid_records`). `topics` limits where."""

    def __init__(self, settings: dict[str, str], topics: list[str] | None = None) -> None:
        super().__init__()
        self.settings, self.topics = settings, topics
        self.forged: list[r.Record] = []
        self.sent_to: list[str] = []

    def on_event(self, event: r.Event) -> None:
        if self.injected or not any_finished(event) or self.driver is None:
            return
        assert isinstance(event, r.AttemptFinished)
        self.injected = 1
        # On the driver's thread (a few ms on a local broker): the forged commands are then on
        # the topic while the job still has work to do, and the agent reads them mid-job.
        self._send(self.driver.job_id, event, [event.host])

    def _send(self, job_id: str, event: r.AttemptFinished, hosts: list[str]) -> None:
        codec = codec_for(self.settings)
        producer = RecordProducer(self.settings, codec)
        topics = self.topics or every_topic(self.settings)
        for topic in topics:
            for value in undecodable(codec, event):
                producer.send_bytes(topic, job_id.encode(), value)
        self.sent_to = topics
        self.forged = invalid_records(job_id, event.ts, hosts)
        for record in self.forged:
            if self.topics is None or type(record).TOPIC in self.topics:
                producer.send(record)
        producer.flush(10.0)
        self.notes.append(
            f"undecodable bytes on {len(topics)} topics, {len(self.forged)} invalid records"
        )
        if self.driver is not None and (self.topics is None or r.COMMANDS_TOPIC in self.topics):
            # Held until the agent has them: a short job could otherwise end before its reader
            # fetched them (seen once in a full suite run), and nothing would be rejected.
            wait_until_received(
                self.driver,
                [x.id for x in self.forged if isinstance(x, r.Command) and x.job_id == job_id],
            )

    def is_forged(self, record: r.Record) -> bool:
        return record.id.startswith(FORGED) or record.id in {x.id for x in self.forged}


# ---------------------------------------------------------------------- storage


class StorageOutage(Fault):
    """The object store (a moto S3 server holding the result partitions) stopped at the first
    finished attempt for `outage_s` seconds, then started again on the same port with its data
    (moto's state lives in this process). Recovery: from the restart to the next finished
    attempt."""

    def __init__(self, stop: Callable[[], None], start: Callable[[], None], outage_s: float):
        super().__init__()
        self.stop, self.start, self.outage_s = stop, start, outage_s

    def on_event(self, event: r.Event) -> None:
        if self.injected or not head_finished(event):
            return
        self.injected = 1
        self.background(self._outage)

    def _outage(self) -> None:
        self.stop()
        # The fault's duration, not synchronisation: storage is down for this long.
        threading.Event().wait(self.outage_s)
        self.start()
        self.recovered_when(any_finished, time.monotonic())
