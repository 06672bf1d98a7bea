"""The driver and where a command came from: with signing on, an unsigned, forged or
not-permitted command is rejected with its reason, uses up no id and settles no fallback, and
the job goes on; and a RestartTasks of finished source subtasks (issue 10's crash) is taken
without harm when signing is off."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from agent_fakes import FakeRuntime, Harness, one_subtask_job, run_all, write_parquet_input
from test_agent_commands import answers

from tailguard.agent.driver.ports import CommandReceived
from tailguard.agent.executor.storage import Storage
from tailguard.agent.graph.api import Job
from tailguard.decider.policy import ParallelismDecider
from tailguard.model import records as r
from tailguard.model.authority import AGENT, Origin, Signed, Unauthentic, Unchecked
from tailguard.model.config import Settings

FORGED = Unauthentic("unsigned (no tailguard.signature header)")


def fail_job(job_id: str, cid: str = "failover-1", reason: str = "forged") -> r.FailJob:
    return r.FailJob(job_id=job_id, ts=1, id=cid, reason=reason)


def send(h: Harness, command: r.Command, origin: Origin) -> None:
    h.post(CommandReceived(command, origin))


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[Harness]:
    h = one_subtask_job(tmp_path).start()
    yield h
    h.stop()


def test_a_forged_fail_job_is_rejected_with_its_reason_and_the_job_goes_on(
    driver: Harness,
) -> None:
    send(driver, fail_job(driver.driver.job_id), FORGED)
    reason = "unauthenticated: unsigned (no tailguard.signature header)"
    assert answers(driver, "failover-1") == [("CommandRejected", reason)]
    assert not driver.finished
    # The forgery used up nothing: the failover service's own command with that id is taken.
    send(driver, fail_job(driver.driver.job_id, reason="restart limit"), Signed("failover", "k"))
    result = driver.result()
    assert result.status == "FAILED" and result.message == "restart limit"
    assert result.commands_rejected == (("failover-1", "FailJob", reason),)
    assert result.commands_applied == 1


def test_a_fail_job_signed_by_another_service_is_not_permitted(driver: Harness) -> None:
    send(driver, fail_job(driver.driver.job_id, "blocklist-1"), Signed("blocklist", "k"))
    assert answers(driver, "blocklist-1") == [
        ("CommandRejected", "not permitted: FailJob is accepted only from failover, not blocklist")
    ]
    assert not driver.finished


def test_a_block_of_every_host_from_a_forger_never_reaches_the_guard(driver: Harness) -> None:
    block = r.BlockNodes(
        job_id=driver.driver.job_id, ts=1, id="blocklist-2", hosts=("h1",), until_ts=10**15
    )
    send(driver, block, Unauthentic("signature does not match (claims signer 'blocklist')"))
    (answer,) = answers(driver, "blocklist-2")
    assert answer[1].startswith("unauthenticated: signature does not match")
    assert not driver.driver.pool.blocked()


def test_without_a_key_every_command_is_taken_as_before(driver: Harness) -> None:
    send(driver, fail_job(driver.driver.job_id, "anyone-1"), Unchecked())
    assert driver.result().message == "forged"


# --------------------------------------------------------------------------- fallbacks


def test_a_forged_copy_of_a_pending_decision_does_not_settle_the_fallback(tmp_path: Path) -> None:
    """The decider's id is predictable: a forger who sends it first must not stop the agent from
    deciding itself when the decider does not answer."""
    job = Job("adaptive")
    source = job.read_parquet(str(write_parquet_input(tmp_path / "in.parquet")), name="src")
    source.write_parquet(str(tmp_path / "out"), name="out")
    settings = {"decider.timeout": "300 ms"}
    runtime = FakeRuntime.hosts(h1=1)
    h = Harness(job, runtime, Storage(str(tmp_path / "st")), services=True, settings=settings)
    h.start()
    try:
        (submitted,) = [e for e in h.publisher.events if isinstance(e, r.JobSubmitted)]
        (decision,) = ParallelismDecider(Settings(settings)).handle(submitted)
        assert isinstance(decision, r.SetParallelism)
        send(h, decision, FORGED)
        assert [a for a, _ in answers(h, decision.id)] == ["CommandRejected"]
        # The local decision still applies once the decider's time is up.
        assert runtime.wait_deployed(1)
        assert h.driver.state.vertices["src→out"].decided_by == "agent-fallback"
        # Its echo from the log, signed by the agent, is ignored like any id already handled.
        send(h, decision, Signed(AGENT, "k"))
        assert [a for a, _ in answers(h, decision.id)] == ["CommandRejected", "CommandApplied"]
    finally:
        h.stop()


# --------------------------------------------------------------------------- issue 10's crash


def double(t: pa.Table) -> pa.Table:
    return t.set_column(1, "amount", pa.compute.multiply(t["amount"], 2))


def totals(t: pa.Table) -> pa.Table:
    return t.group_by("region").aggregate([("amount", "sum")])


def test_a_restart_of_finished_source_subtasks_is_taken_and_the_output_stays_exact(
    tmp_path: Path,
) -> None:
    """Issue 10: a RestartTasks of finished source subtasks, sent from a plain producer while
    their consumers run, crashed the agent. Without a key it is taken (nothing tells it from the
    failover service's): the sources run again and the job ends with the exact output."""
    data = write_parquet_input(tmp_path / "in" / "sales.parquet")
    job = Job("restart-sources")
    doubled = job.read_parquet(str(tmp_path / "in"), name="src", parallelism=2).map(
        double, name="double", parallelism=2
    )
    summed = doubled.partition_by("region").map(totals, name="sum", parallelism=3)
    summed.write_parquet(str(tmp_path / "out"), name="out", parallelism=3)
    head, tail = "src→double", "sum→out"
    runtime = FakeRuntime.hosts(h1=1, h2=1, h3=1)
    # No decider runs here: the fixed consumer's byte-balanced ranges come from the local
    # fallback at once.
    no_decider = {"decider.timeout": "0 ms"}
    h = Harness(job, runtime, Storage(str(tmp_path / "st")), services=True, settings=no_decider)
    h.start()
    try:
        h.run((head, 0, 0))
        h.run((head, 1, 0))
        assert runtime.wait_deployed(5)
        h.run((tail, 0, 0))  # one consumer done, two still deployed
        restart = r.RestartTasks(
            job_id=h.driver.job_id,
            ts=int(time.time() * 1000),
            id="forged-restart",
            tasks=(r.TaskRef(head, 0), r.TaskRef(head, 1)),
            reason="forged",
            not_before_ts=0,
        )
        send(h, restart, Unchecked())
        assert answers(h, "forged-restart") == [("CommandApplied", "RestartTasks")]
        result = run_all(h)
    finally:
        h.stop()
    assert result.status == "SUCCEEDED", result.message
    # The sources ran again.
    ran = {(a.subtask, a.attempt, a.status) for a in result.attempts if a.vertex == head}
    assert {(0, 1, "FINISHED"), (1, 1, "FINISHED")} <= ran, ran
    table = pq.read_table(data)
    expected: dict[str, float] = {}
    for region, amount in zip(
        table["region"].to_pylist(), table["amount"].to_pylist(), strict=True
    ):
        expected[region] = expected.get(region, 0.0) + 2 * amount
    out = pq.read_table(tmp_path / "out")
    regions: list[Any] = out["region"].to_pylist()
    assert len(regions) == len(set(regions)), "a region in two output files"
    assert dict(zip(regions, out["amount_sum"].to_pylist(), strict=True)) == pytest.approx(expected)
