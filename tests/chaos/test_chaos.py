"""The fault-injection suite (`make chaos`; issue 14 item 3): the sales job on the 3-worker
local cluster (one host 5x slow, so the detector, speculator and blocklist have work) with the
five services, one fault per case, injected at an event of the job (see faults.py). Every case
records its figures in the report (conftest.py) and then checks the issue's targets: job
SUCCEEDED, output exact, 0 replay differences, 0 commands applied twice.

Order matters: the cases that break shared processes come last (a killed worker's cluster is
replaced by the harness on the next request; the broker case runs last of all).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tests.chaos.faults import (
    BrokerKill,
    ForgedRecords,
    HostProcessKill,
    PartitionDamage,
    ServiceKills,
    StorageOutage,
    head_finished,
)
from tests.chaos.toolkit import CaseResult, Fault, SalesData, run_case, sales_data

from tailguard import filesystems
from tailguard.agent.executor.sinks import committed_files
from tailguard.broker.embedded import EmbeddedBroker
from tailguard.cluster.local import free_port
from tailguard.demo import DEMO_POLICY, IO_S_PER_ROW, SLOW_MODE
from tailguard.examples import sales_by_region as example
from tailguard.kafka.signing import KEY_SETTING
from tailguard.model import records as r
from tailguard.processes import trees
from tailguard.system.services import SERVICE_NAMES
from tailguard.testing import Broker, Harness, Services, run_settings
from tailguard.testing.harness import toml_settings

SLOW_HOST = "127.0.0.4"
CHAOS_SIGNING_KEY = "chaos-suite-signing-key-0123456789abcdef"
# The e2e test's size: long enough for two service restarts (~5-7 s each) inside one job; 8 files
# of 8,000 rows (CPU work 60,000) ran 3 head subtasks and ended within ~25 s, before the second
# kill. The work is the demo's I/O-bound work (2.4 s per split of 6,000 rows on a healthy host),
# and the slow host is slowed as the demo's is (io mode): three executors outnumber this machine's
# two cores, so pausing one (cpu mode) would hand its CPU to the others (design §7).
FILES, ROWS = 12, 12_000

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.tailguard_cluster(workers=3, slow={SLOW_HOST: 5}, slow_mode=SLOW_MODE),
    # Signed, as docs/security.md says to deploy: the garbage case's forged facts and findings
    # are then refused by the services and kept apart by the agent, so replay stays exact (an
    # unsigned deployment cannot tell a forged fact from its agent's, and its replay differs).
    pytest.mark.tailguard_services(settings={**DEMO_POLICY, KEY_SETTING: CHAOS_SIGNING_KEY}),
]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> SalesData:
    return sales_data(tmp_path_factory.mktemp("chaos-data"), files=FILES, rows=ROWS)


def check(result: CaseResult) -> None:
    """The issue's targets, after the figures are in the report."""
    assert not result.missed(), f"{result.case}: {', '.join(result.missed())}. {result.note}"


@dataclass
class Chaos:
    """What every case on the cluster shares: the data, the Spark session on the cluster, the
    services, the case's directory and the report."""

    data: SalesData
    spark: Any
    services: Services
    work: Path
    report: list[CaseResult]

    def run(self, name: str, fault: Fault, **kwargs: Any) -> CaseResult:
        """Run the job under `fault`, add the case's figures to the report, check the targets."""
        result = CaseResult(name)
        self.report.append(result)
        run_case(result, fault, self.data, self.spark, self.services, self.work,
                 work_per_row=0, io_s_per_row=IO_S_PER_ROW, **kwargs)  # fmt: skip
        check(result)
        return result


@pytest.fixture
def chaos(
    data: SalesData,
    tailguard_spark: Any,
    tailguard_services: Services,
    tmp_path: Path,
    chaos_report: list[CaseResult],
) -> Chaos:
    return Chaos(data, tailguard_spark, tailguard_services, tmp_path, chaos_report)


# ---------------------------------------------------------------------- services


@pytest.mark.parametrize("name", SERVICE_NAMES)
def test_service_killed_twice_per_job(name: str, chaos: Chaos) -> None:
    fault = ServiceKills(chaos.services, name, times=2)
    chaos.run(f"kill-9-{name}-x2", fault)
    assert fault.injected == 2, f"killed {fault.injected} time(s): the job ended first"


# ---------------------------------------------------------------------- result partitions


@pytest.mark.parametrize("how", ["delete", "corrupt"])
def test_result_partition_damaged_before_it_is_read(how: str, chaos: Chaos) -> None:
    chaos.run(f"partition-{how.rstrip('e')}ed", PartitionDamage(how))


# ---------------------------------------------------------------------- garbage


def test_garbage_and_invalid_records_on_every_topic(chaos: Chaos) -> None:
    fault = ForgedRecords(dict(chaos.services.settings.overrides()))
    try:
        chaos.run("garbage-every-topic", fault, replay_ignores=fault.is_forged)
    finally:
        # Every service survived the bytes and records it could not use (or is started again
        # for the next case, and the report says so).
        dead = sorted(set(SERVICE_NAMES) - set(chaos.services.running()))
        if dead:
            chaos.report[-1].note = (
                f"services dead after the garbage: {dead}; " + chaos.report[-1].note
            )
            chaos.services.start()
    assert not dead, f"services died of garbage: {dead}"


# ---------------------------------------------------------------------- storage


@pytest.fixture
def s3_store() -> Iterator[dict[str, Any]]:
    """A moto S3 server on a fixed port that the case can stop and start again."""
    moto_server = pytest.importorskip("moto.server", reason="moto[server] is in the dev extra")
    import pyarrow.fs as pafs

    port = free_port()
    servers = [moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)]
    servers[0].start()
    settings = {
        "s3.endpoint": f"http://127.0.0.1:{port}",
        "s3.access-key": "AKIACHAOS",
        "s3.secret-key": "chaos-secret",
        "s3.path.style.access": "true",
        "s3.endpoint.region": "us-east-1",
    }
    bucket = f"chaos-{uuid.uuid4().hex[:8]}"
    pafs.S3FileSystem(
        access_key=settings["s3.access-key"],
        secret_key=settings["s3.secret-key"],
        endpoint_override=settings["s3.endpoint"],
        region="us-east-1",
        scheme="http",
        allow_bucket_creation=True,
    ).create_dir(bucket)

    def stop() -> None:
        servers[-1].stop()

    def start() -> None:
        # moto keeps its buckets in this process: the new server serves the same data.
        servers.append(
            moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        )
        servers[-1].start()

    yield {"settings": settings, "storage": f"s3a://{bucket}/storage", "stop": stop, "start": start}
    servers[-1].stop()
    filesystems.configure(None)


def test_storage_fails_writes_for_seconds(chaos: Chaos, s3_store: dict[str, Any]) -> None:
    # Root ignores a read-only directory, so the failing store is an S3 server that is down.
    fault = StorageOutage(s3_store["stop"], s3_store["start"], outage_s=5.0)
    chaos.run("storage-down-5s", fault, settings=s3_store["settings"],
              storage=s3_store["storage"])  # fmt: skip


# ---------------------------------------------------------------------- the driver


def _recover_supported() -> bool:
    import argparse

    from tailguard.agent import run_cli

    parser = argparse.ArgumentParser()
    run_cli.add_arguments(parser)
    return any("--recover" in action.option_strings for action in parser._actions)


def test_driver_killed_then_recovered(
    data: SalesData,
    tailguard_harness: Harness,
    tailguard_cluster: Any,
    tailguard_services: Services,
    tmp_path: Path,
    chaos_report: list[CaseResult],
) -> None:
    if not _recover_supported():
        pytest.skip("`tailguard run --recover JOB_ID` does not exist yet (issue 14 item 1)")
    # The driver is a process of its own here, and the pytest session's application would hold
    # every core of the cluster: its executors would never start.
    tailguard_harness.release_spark()
    result = CaseResult("kill-9-driver-recover")
    chaos_report.append(result)
    settings = run_settings(tmp_path, tailguard_services, None)
    config = tmp_path / "tailguard.toml"
    config.write_text(toml_settings(settings.overrides()))
    # `tailguard run` finds sales_by_region's data under work_dir/data/sales: the case's own.
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "sales").symlink_to(data.path)
    command = [
        str(Path(sys.executable).parent / "tailguard"),
        "run",
        example.__file__,
        "--master",
        tailguard_cluster.master_url,
        "--no-progress",
        "--param",
        f"work_dir={tmp_path}",
        "--param",
        f"io_s_per_row={IO_S_PER_ROW}",
    ]
    env = {**os.environ, "TAILGUARD_CONFIG": str(config)}
    archive_dir = Path(settings["tailguard.archive-dir"])
    log = (tmp_path / "driver.log").open("wb")
    first = subprocess.Popen(
        command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    job_id, began = _await_first_head_finish(tailguard_services, first, timeout_s=300)
    killed_at = time.monotonic()
    trees.signal_all(trees.descendants(first.pid), signal.SIGKILL)
    first.wait()
    result.faults = 1
    second = subprocess.run(
        [*command, "--recover", job_id],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        timeout=600,
        check=False,
    )
    result.recover_s = round(time.monotonic() - killed_at, 1)
    result.job_s = round(time.monotonic() - began, 1)
    result.outcome = "SUCCEEDED" if second.returncode == 0 else f"exit {second.returncode}"
    _figures_of_archive(
        result, archive_dir / f"{job_id}.avro", settings, tmp_path / "out" / "sales_by_region", data
    )
    check(result)


def _await_first_head_finish(
    services: Services, driver: subprocess.Popen[bytes], timeout_s: float
) -> tuple[str, float]:
    """The job id of the driver's job once its first head attempt finished (read from the
    events topic, as any consumer would), and when the driver started."""
    from tailguard.codec import codec_for
    from tailguard.kafka.consumer import RecordConsumer

    began = time.monotonic()
    settings = dict(services.settings.overrides())
    consumer = RecordConsumer(
        settings,
        codec_for(settings),
        [r.EVENTS_TOPIC],
        group_id=f"chaos-{uuid.uuid4().hex}",
        from_beginning=True,
    )
    jobs: set[str] = set()
    try:
        while time.monotonic() - began < timeout_s:
            if driver.poll() is not None:
                raise AssertionError(f"the driver exited ({driver.returncode}) before the kill")
            for item in consumer.poll(0.5):
                event = item.record
                if isinstance(event, r.JobSubmitted) and event.name == "sales-by-region":
                    jobs.add(event.job_id)
                elif event.job_id in jobs and head_finished(event):  # type: ignore[arg-type]
                    return event.job_id, began
    finally:
        consumer.close()
    raise AssertionError(f"no head attempt finished within {timeout_s:.0f} s")


def _figures_of_archive(
    result: CaseResult, archive: Path, settings: Any, out: Path, data: SalesData
) -> None:
    from tailguard.replay.engine import replay
    from tailguard.replay.inputs import read_archive

    recorded = list(read_archive(str(archive), settings))
    report = replay(recorded, settings)
    result.replay_differences = report.differences
    applied = Counter(
        x.record.command_id for x in recorded if isinstance(x.record, r.CommandApplied)
    )
    result.applied_twice = sum(1 for n in applied.values() if n > 1)
    files = committed_files(str(out))
    if files is None:
        result.exact = False
        result.note = "sink not committed"
        return
    table = pa.concat_tables([pq.read_table(out / name) for name in sorted(files)])
    actual = table.to_pandas().sort_values("region").reset_index(drop=True)
    expected = data.reference
    result.exact = bool(actual[expected.columns.tolist()].equals(expected))


# ---------------------------------------------------------------------- executors and workers


@pytest.mark.parametrize("what", ["executor", "worker"])
def test_host_process_killed_mid_attempt(what: str, tailguard_cluster: Any, chaos: Chaos) -> None:
    chaos.run(f"kill-9-{what}", HostProcessKill(tailguard_cluster, what))


# ---------------------------------------------------------------------- the broker (last)


def test_broker_killed_and_restarted(tailguard_broker: Broker, chaos: Chaos) -> None:
    fault = BrokerKill(tailguard_broker, chaos.services)
    try:
        chaos.run("kill-9-broker", fault)
    finally:
        # The harness stops only the broker pid it started; the restarted one is this case's.
        if fault.new_pid is not None and fault.new_pid != tailguard_broker.pid:
            EmbeddedBroker(tailguard_broker.work_dir).stop()
