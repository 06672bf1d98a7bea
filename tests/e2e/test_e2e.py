"""End to end: the embedded broker, a 3-worker local cluster with one node 5x slow, the five
services as separate processes, and the sales job through the agent.

One job run carries most checks (speculation, blocking, decided parallelism, an injected task
failure and a deleted partition recovered by the failover service, exact output, replay); a
second run kills a service with -9 mid-job and restarts it.
"""

from __future__ import annotations

import shutil
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tailguard.agent.driver.driver import JobDriver
from tailguard.agent.driver.hooks import JobHooks
from tailguard.agent.executor.partitions import partition_dir
from tailguard.demo import DEMO_POLICY, IO_S_PER_ROW, SLOW_MODE
from tailguard.examples import sales_by_region as example
from tailguard.model import records as r
from tailguard.testing import (
    Harness,
    JobRun,
    Services,
    assert_output_equals,
    assert_replay_clean,
    assert_succeeded,
    run_job,
)

# The demo's work, I/O-bound (2.4 s per split of 6,000 rows on a healthy host), on a host slowed
# as the demo's is (io mode): three executors outnumber this machine's two cores, so pausing one
# (cpu mode) would hand its CPU to the other two (design §7).
FILES, ROWS = 12, 12_000
SLOW_HOST = "127.0.0.4"  # the third of the three workers, 5x slow for the whole module
# The sales example runs as two chains.
HEAD = "sales→score→partial"
# The injected failure fires after an attempt's first batch. An attempt placed on the slow host
# can lose its speculative race before it gets there (seen on PySpark 3.5: HEAD#1's first attempt
# went to the slow host and never failed), so two head subtasks carry it: with one slot per host,
# their first attempts run on different hosts and at least one is on a healthy one.
INJECTED = ((HEAD, 1, 0), (HEAD, 2, 0))
TAIL = "final→sink"

# The plugin's stack, shared with every other test that asks for the same: the embedded
# broker, three workers (one slow for I/O-bound work) and the five services
# with the demo's policy. Skipped with the reason where there is no JDK (tests/conftest.py).
pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.tailguard_cluster(workers=3, slow={SLOW_HOST: 5}, slow_mode=SLOW_MODE),
    pytest.mark.tailguard_services(settings=DEMO_POLICY),
]


@dataclass
class Stack:
    work: Path
    services: Services
    spark: Any
    cluster: Any
    slow_host: str
    data: Path


@pytest.fixture(scope="module")
def system(
    tailguard_harness: Harness, request: pytest.FixtureRequest, tmp_path_factory: Any
) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("e2e")
    data = example.generate(work / "data", files=FILES, rows_per_file=ROWS)
    services = tailguard_harness.services_of(request.node)
    spark = tailguard_harness.spark_of(request.node)
    with tailguard_harness.slow_hosts_of(request.node):
        yield Stack(
            work, services, spark, tailguard_harness.cluster_of(request.node), SLOW_HOST, data
        )


def run(
    system: Stack, name: str, hooks: JobHooks, final_parallelism: int | None = None
) -> tuple[JobRun, list[r.Record]]:
    out = system.work / "out" / name
    job = example.make_job(system.data, out, name=name, io_s_per_row=IO_S_PER_ROW)
    if final_parallelism is not None:  # the final chain with a fixed parallelism
        job.vertices["final"].parallelism = final_parallelism
        job.vertices["sink"].parallelism = final_parallelism
    job_run = run_job(
        job, system.spark, system.work / "runs" / name, services=system.services, hooks=hooks
    )
    assert_succeeded(job_run)
    assert_output_equals(job_run, example.reference(system.data), ignore_order=True)
    assert len(list(out.glob("part-*.parquet"))) == job_run.result.parallelism[TAIL][0]
    return job_run, job_run.records


def of(log: list[r.Record], kind: type[r.Record]) -> list[Any]:
    return [x for x in log if isinstance(x, kind)]


@pytest.fixture(scope="module")
def first_run(system: Stack) -> tuple[JobRun, list[r.Record]]:
    runner: list[JobDriver] = []
    deleted: list[r.PartitionRef] = []

    def delete_partition(event: r.Event) -> None:
        # The consumer of the head chain reads only once every subtask of it has finished, so
        # this file is gone before anyone reads it.
        # The first partition of the head chain to finish (a fixed subtask could lose a
        # speculative race and never finish).
        if isinstance(event, r.AttemptFinished) and event.vertex == HEAD and not deleted:
            ref = r.PartitionRef(event.vertex, event.subtask, event.attempt)
            shutil.rmtree(partition_dir(runner[0].storage, runner[0].job_id, ref))
            deleted.append(ref)

    hooks = JobHooks(
        fail_attempts={key: "injected failure" for key in INJECTED},
        on_event=delete_partition,
        on_start=runner.append,
    )
    return run(system, "e2e-main", hooks)


def test_slow_attempts_found_and_speculated_on_another_host(
    system: Stack, first_run: tuple[JobRun, list[r.Record]]
) -> None:
    result, log = first_run[0].result, first_run[1]
    findings = [f for f in of(log, r.SlowTasksDetected) if f.slow]
    assert findings, "the detector found no slow attempt"
    assert any(
        a.host == system.slow_host for f in findings for s in f.slow for a in s.live_attempts
    )
    speculative = [d for d in of(log, r.AttemptDeploying) if d.speculative]
    assert speculative, "no speculative attempt ran"
    # A copy avoids the hosts of the attempts of its subtask that are live when it starts.
    live: dict[tuple[str, int, int], str] = {}
    races: list[set[tuple[str, int, int]]] = []
    for record in log:
        if isinstance(record, r.AttemptDeploying):
            if record.speculative:
                assert record.command_id and record.command_id.startswith("speculator-")
                mirrored = {
                    host
                    for (vertex, subtask, _), host in live.items()
                    if (vertex, subtask) == (record.vertex, record.subtask)
                }
                assert mirrored and record.host not in mirrored, (record, mirrored)
                races.append(
                    {k for k in live if k[:2] == (record.vertex, record.subtask)}
                    | {(record.vertex, record.subtask, record.attempt)}
                )
            live[(record.vertex, record.subtask, record.attempt)] = record.host
        elif isinstance(record, r.AttemptFinished | r.AttemptFailed | r.AttemptCanceled):
            live.pop((record.vertex, record.subtask, record.attempt), None)
    # Which attempt finishes first is timing (a loaded machine delays the copy's start); the
    # race itself is checked deterministically in tests/integration/test_agent_cluster.py. Here:
    # every copy's race ended with one winner, and a loser was cancelled as LOST_RACE.
    for members in races:
        ended = [
            e
            for e in of(log, r.AttemptFinished) + of(log, r.AttemptCanceled)
            if (e.vertex, e.subtask, e.attempt) in members
        ]
        winners = [e for e in ended if isinstance(e, r.AttemptFinished)]
        reasons = {e.reason for e in ended if isinstance(e, r.AttemptCanceled)}
        assert len(winners) <= 1, ended
        assert reasons <= ({r.CancelReason.LOST_RACE} if winners else {r.CancelReason.RESTART})
    print(f"speculative copies {len(speculative)}, won {result.speculative_wins}")


def test_slow_host_blocked_and_avoided(
    system: Stack, first_run: tuple[JobRun, list[r.Record]]
) -> None:
    _, log = first_run
    blocked = [e for e in of(log, r.NodeBlocked) if e.host == system.slow_host]
    assert blocked, "the slow host was never blocked"
    assert all(b.command_id and b.command_id.startswith("blocklist-") for b in blocked)
    # Between a block and its lifting, no new attempt starts on the host.
    blocked_now = False
    for record in log:
        if isinstance(record, r.NodeBlocked) and record.host == system.slow_host:
            blocked_now = True
        elif isinstance(record, r.NodeUnblocked) and record.host == system.slow_host:
            blocked_now = False
        elif isinstance(record, r.AttemptDeploying) and blocked_now:
            assert record.host != system.slow_host, f"{record} deployed on a blocked host"


def test_decider_parallelism_applied(first_run: tuple[JobRun, list[r.Record]]) -> None:
    result, log = first_run[0].result, first_run[1]
    assert {by for _, by in result.parallelism.values()} == {"decider"}
    applied = {e.command_id for e in of(log, r.CommandApplied)}
    decisions = of(log, r.SetParallelism)
    assert decisions and all(d.id in applied for d in decisions)


def test_failure_and_lost_partition_recovered_by_failover_service(
    system: Stack, first_run: tuple[JobRun, list[r.Record]]
) -> None:
    result, log = first_run[0].result, first_run[1]
    failures = {(f.vertex, f.subtask, f.error) for f in of(log, r.AttemptFailed)}
    placed = {(d.vertex, d.subtask, d.attempt): d.host for d in of(log, r.AttemptDeploying)}
    # Every injected attempt on a healthy host failed as the user's code, and was restarted.
    healthy = [
        (v, s)
        for (v, s, a) in INJECTED
        if placed.get((v, s, a), system.slow_host) != system.slow_host
    ]
    assert healthy, f"every injected attempt was placed on the slow host: {placed}"
    for vertex, subtask in healthy:
        assert (vertex, subtask, r.ErrorKind.USER) in failures
    missing = [f for f in of(log, r.AttemptFailed) if f.error is r.ErrorKind.PARTITION_MISSING]
    first = next(e for e in of(log, r.AttemptFinished) if e.vertex == HEAD)
    lost = r.PartitionRef(HEAD, first.subtask, first.attempt)
    assert missing and missing[0].missing_partition == lost
    restarts = of(log, r.RestartTasks)
    assert restarts and all(c.id.startswith("failover-") for c in restarts)
    restarted = {(t.vertex, t.subtask) for c in restarts for t in c.tasks}
    assert all(key in restarted for key in healthy) and (HEAD, lost.subtask) in restarted
    # The services answered: no failover decision was the agent's own fallback.
    assert not [n for n in result.fallbacks if n.startswith("failover")]


def test_replay_reproduces_every_decision(
    system: Stack, first_run: tuple[JobRun, list[r.Record]]
) -> None:
    report = assert_replay_clean(first_run[0])
    by_name = {s.service: s for s in report.services}
    assert by_name["detector"].reproduced > 0
    assert by_name["speculator"].reproduced > 0
    assert by_name["decider"].reproduced >= 2


@pytest.mark.long
def test_service_killed_mid_job_changes_nothing(system: Stack) -> None:
    victim = "decider"
    restarted = threading.Event()

    def kill_and_restart() -> None:
        system.services.kill(victim)
        system.services.start([victim])
        restarted.set()

    def on_event(event: r.Event) -> None:
        if isinstance(event, r.AttemptFinished) and event.vertex == HEAD and event.subtask == 0:
            threading.Thread(target=kill_and_restart, daemon=True).start()

    job_run, log = run(system, "e2e-kill", JobHooks(on_event=on_event))
    assert restarted.wait(60), "the killed service did not come back"
    applied = Counter(e.command_id for e in of(log, r.CommandApplied))
    assert applied and max(applied.values()) == 1, "a command id was applied twice"
    assert_replay_clean(job_run)


@pytest.mark.long
def test_lost_partition_with_many_queued_consumers_is_recovered(system: Stack) -> None:
    """Issue 9's crash: a deleted HEAD#0 partition under a 12-subtask final chain. The failover
    service restarts HEAD#0 and the consumers that read it while other consumers are queued
    for slots; none of them may be deployed before HEAD#0 is produced again."""
    driver: list[JobDriver] = []
    deleted: list[r.PartitionRef] = []

    def delete_partition(event: r.Event) -> None:
        if isinstance(event, r.AttemptFinished) and (event.vertex, event.subtask) == (HEAD, 0):
            ref = r.PartitionRef(event.vertex, event.subtask, event.attempt)
            if not deleted:
                shutil.rmtree(partition_dir(driver[0].storage, driver[0].job_id, ref))
                deleted.append(ref)

    hooks = JobHooks(on_event=delete_partition, on_start=driver.append)
    job_run, log = run(system, "e2e-lost-partition", hooks, final_parallelism=12)
    result = job_run.result
    assert deleted
    # Fixed, with its byte-balanced ranges from the decider service (blocking inputs).
    assert result.parallelism[TAIL] == (12, "decider")
    missing = [f for f in of(log, r.AttemptFailed) if f.error is r.ErrorKind.PARTITION_MISSING]
    assert missing and all(f.missing_partition == deleted[0] for f in missing)
    # A copy asked for a subtask that finished before the command arrived is the one race the
    # guard settles by design (seen in CI: two of the final chain's subtasks on the slow host);
    # any other rejection is a failure of the recovery.
    late_copies = [
        c
        for c in result.commands_rejected
        if c[1] == "LaunchSpeculativeAttempts" and c[2].endswith("already finished")
    ]
    assert [c for c in result.commands_rejected if c not in late_copies] == []
    assert "agent error" not in result.message
