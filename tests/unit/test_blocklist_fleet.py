"""FleetBlocklist: one view of slow hosts across jobs, published as FleetBlock changes.

Defaults: two distinct slow subtasks within the evidence window block a host."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from speculation_histories import slow_finding

from tailguard.agent.driver.commands import HANDLERS
from tailguard.agent.driver.slots import SlotPool
from tailguard.blocklist.fleet import FleetBlocklist
from tailguard.blocklist.policy import BlocklistTracker
from tailguard.model.config import Settings
from tailguard.model.fleet import (
    FLEET_CAUSE_PREFIX,
    FLEET_SETTING,
    FleetBlock,
    current_entries,
    is_fleet_cause,
)
from tailguard.model.records import (
    COMMANDS_TOPIC,
    EVENTS_TOPIC,
    FINDINGS_TOPIC,
    BlockNodes,
    CommandApplied,
    NodeAdded,
    NodeBlocked,
    Record,
    SlowAttempt,
    SlowSubtask,
    SlowTasksDetected,
)
from tailguard.replay.engine import Recorded, ServiceReport, replay

MIN = 60_000
HOSTS = tuple(f"h{i}" for i in range(6))


def slow_on(n: int, host: str) -> SlowSubtask:
    return SlowSubtask(n, (SlowAttempt(0, host, 90_000, None, False, True),), 0)


def sent(records: list[Record]) -> dict[str, tuple[tuple[str, ...], int]]:
    return {r.job_id: (r.hosts, r.until_ts) for r in records if isinstance(r, BlockNodes)}


def entries(records: list[Record]) -> list[FleetBlock]:
    return [r for r in records if isinstance(r, FleetBlock)]


def test_evidence_from_two_jobs_blocks_a_host_no_job_alone_would() -> None:
    fleet = FleetBlocklist(Settings(), publish_view=True)
    first = fleet.handle(slow_finding(slow_on(0, "h1"), job_id="a", ts=1000, hosts=HOSTS))
    assert first == []  # one slow subtask: not enough
    second = slow_finding(slow_on(3, "h1"), job_id="b", ts=2000, hosts=HOSTS)
    out = fleet.handle(second)
    # Both jobs have h1 and both get the block, with one expiry and the evidence of both.
    assert sent(out) == {"a": (("h1",), 2000 + MIN), "b": (("h1",), 2000 + MIN)}
    command = next(r for r in out if isinstance(r, BlockNodes))
    assert command.caused_by == ("f-a-v-1000", "f-b-v-2000")
    assert command.cause.startswith(FLEET_CAUSE_PREFIX)
    [entry] = entries(out)
    assert (entry.host, entry.until_ts, entry.evidence) == (
        "h1",
        2000 + MIN,
        ("f-a-v-1000", "f-b-v-2000"),
    )
    assert fleet.view() == {"h1": (2000 + MIN, ("f-a-v-1000", "f-b-v-2000"))}


def _bench_job(job_id: str, start: int, speculative_on: str) -> list[SlowTasksDetected]:
    """One job of `make bench-fleet` as its archive received it: subtask 5 slow on h5 alone
    (its speculative copy on another host not slow), repeated every Tick, then the empty
    finding once the copy won."""
    copy = SlowAttempt(1, speculative_on, 200, None, True, False)
    findings = [
        slow_finding(
            SlowSubtask(5, (SlowAttempt(0, "h5", 6_750 + i * 250, None, False, True), copy), 1),
            job_id=job_id,
            ts=start + i * 250,
            hosts=HOSTS,
        )
        for i in range(9)
    ]
    return [*findings, slow_finding(job_id=job_id, ts=start + 9 * 250, hosts=HOSTS)]


def test_jobs_in_a_row_further_apart_than_the_evidence_window_block_the_host() -> None:
    # make bench-fleet's run (load 16-37): five jobs one after another with one slow attempt
    # each on the 5x slow host, 167-258 s between one job's last finding and the next job's
    # first, block duration 10 min and the default evidence window of 2 min. Each job's
    # evidence had aged out of the window before the next job's came, so the host never
    # reached the fleet list. Evidence from a job that ended is remembered as long as a block
    # would last.
    fleet = FleetBlocklist(
        Settings({"execution.batch.speculative.block-slow-node-duration": "10 min"}),
        publish_view=True,
    )
    job1, job2 = _bench_job("j1", 0, "h4"), _bench_job("j2", 2_000 + 199_973, "h3")
    assert [r for f in job1 for r in fleet.handle(f)] == []
    out = fleet.handle(job2[0])
    [entry] = entries(out)
    assert (entry.host, entry.until_ts) == ("h5", job2[0].ts + 10 * MIN)
    assert entry.evidence == (job1[8].id, job2[0].id)
    assert sent(out)["j2"] == (("h5",), job2[0].ts + 10 * MIN)
    assert fleet.view() == {"h5": (job2[0].ts + 10 * MIN, (job1[8].id, job2[0].id))}


def test_evidence_older_than_the_window_and_a_block_does_not_count() -> None:
    fleet = FleetBlocklist(Settings(), publish_view=True)  # 1 min blocks, 2 min window
    fleet.handle(slow_finding(slow_on(0, "h1"), job_id="a", ts=0, hosts=HOSTS))
    assert fleet.handle(slow_finding(slow_on(0, "h1"), job_id="b", ts=2 * MIN + 1)) == []
    assert fleet.view() == {}


def test_a_job_keeps_exactly_its_per_job_commands_when_alone() -> None:
    findings = [
        slow_finding(slow_on(0, "h2"), job_id="a", ts=0, hosts=HOSTS),
        slow_finding(slow_on(1, "h2"), job_id="a", ts=1000, hosts=HOSTS),
        slow_finding(slow_on(1, "h2"), job_id="a", ts=MIN // 2 + 1000, hosts=HOSTS),
    ]
    fleet, tracker = FleetBlocklist(Settings()), BlocklistTracker(Settings())
    for finding in findings:
        assert fleet.handle(finding) == tracker.handle(finding)


def test_other_running_jobs_with_the_host_get_it_and_others_do_not() -> None:
    fleet = FleetBlocklist(Settings())
    fleet.handle(slow_finding(job_id="c", ts=0, hosts=("h7", "h8", "h9")))  # other hosts
    fleet.handle(slow_finding(job_id="d", ts=0, hosts=HOSTS))
    out = fleet.handle(slow_finding(slow_on(0, "h1"), slow_on(1, "h1"), job_id="a", ts=10))
    assert set(sent(out)) == {"a", "d"}


def test_a_job_silent_for_longer_than_a_block_is_not_told() -> None:
    fleet = FleetBlocklist(Settings())
    fleet.handle(slow_finding(job_id="old", ts=0, hosts=HOSTS))
    out = fleet.handle(slow_finding(slow_on(0, "h1"), slow_on(1, "h1"), job_id="a", ts=MIN + 1))
    assert set(sent(out)) == {"a"}


def test_the_cap_of_each_job_holds() -> None:
    fleet = FleetBlocklist(Settings({"blocklist.min-slow-attempts": "1"}))
    # Job "small" has 3 hosts: at most 1 blocked (0.5 of 3, floored).
    fleet.handle(slow_finding(job_id="small", ts=0, hosts=("h1", "h2", "h3")))
    out = fleet.handle(
        slow_finding(slow_on(0, "h1"), slow_on(1, "h2"), job_id="big", ts=5, hosts=HOSTS)
    )
    assert sent(out)["big"][0] == ("h1", "h2")
    assert sent(out)["small"][0] == ("h1",)
    assert fleet.metrics()["fleetBlocksRefusedByJobCap"] == 1


def test_one_expiry_extended_by_new_evidence_and_a_tombstone_when_it_ends() -> None:
    fleet = FleetBlocklist(Settings(), publish_view=True)
    two = (slow_on(0, "h1"), slow_on(1, "h1"))
    fleet.handle(slow_finding(*two, job_id="a", ts=0, hosts=HOSTS))
    assert entries(fleet.handle(slow_finding(*two, job_id="a", ts=MIN // 2 - 1))) == []
    [extended] = entries(fleet.handle(slow_finding(*two, job_id="a", ts=MIN // 2, hosts=HOSTS)))
    assert extended.until_ts == MIN // 2 + MIN
    out = fleet.handle(slow_finding(job_id="b", ts=MIN // 2 + MIN, hosts=HOSTS))
    assert [(e.host, e.until_ts) for e in entries(out)] == [("h1", None)]
    assert fleet.view() == {}


def test_the_view_is_a_function_of_the_findings_order() -> None:
    findings = [
        slow_finding(slow_on(i % 3, f"h{i % 2}"), job_id=f"j{i % 4}", ts=i * 7000, hosts=HOSTS)
        for i in range(40)
    ]
    runs = []
    for _ in range(2):
        fleet = FleetBlocklist(Settings(), publish_view=True)
        runs.append([out for f in findings for out in fleet.handle(f)])
    assert runs[0] == runs[1] and entries(runs[0])


def test_current_entries_fold_the_topic_like_compaction() -> None:
    def change(host: str, until: int | None) -> FleetBlock:
        return FleetBlock(job_id="a", ts=0, id=f"{host}{until}", host=host, until_ts=until)

    folded = current_entries(
        [change("h1", 50), change("h2", 500), change("h1", None), change("h3", 90)], now=100
    )
    assert list(folded) == ["h2"]  # h1 removed, h3 expired


# --------------------------------------------------------------------------- replay of the fleet

B_HOSTS = ("h1", "h2", "h3", "h4")


def finding(job: str, ts: int, *slow: SlowSubtask, hosts: tuple[str, ...] = HOSTS) -> Record:
    # Ids name the detector, as the services' ids do (replay attributes records by id).
    return slow_finding(*slow, job_id=job, ts=ts, hosts=hosts, finding_id=f"detector-{job}-{ts}")


def fleet_log() -> tuple[list[Recorded], BlockNodes]:
    """Job b runs on h1-h4 with no slow task; job a's evidence blocks h1: the fleet tells b.
    The log as the topics hold it: every job's findings, the commands, b's events."""
    findings = [
        finding("b", 0, hosts=B_HOSTS),
        finding("a", 1000, slow_on(0, "h1"), slow_on(1, "h1")),
    ]
    fleet = FleetBlocklist(Settings())
    commands = [c for f in findings for c in fleet.handle(f)]
    [to_b] = [c for c in commands if isinstance(c, BlockNodes) and c.job_id == "b"]
    assert is_fleet_cause(to_b.cause) and to_b.caused_by == ("detector-a-1000",)
    log = [Recorded(FINDINGS_TOPIC, f) for f in findings]
    log += [Recorded(COMMANDS_TOPIC, c) for c in commands]
    log += [
        Recorded(EVENTS_TOPIC, NodeAdded(job_id="b", ts=i, id=f"b-add-{h}", host=h, slots=1))
        for i, h in enumerate(B_HOSTS)
    ]
    log.append(Recorded(EVENTS_TOPIC, applied("b", to_b)))
    return log, to_b


def applied(job: str, command: BlockNodes) -> CommandApplied:
    return CommandApplied(
        job_id=job,
        ts=1500,
        id=f"{job}-ok-{command.id}",
        command_id=command.id,
        command_type="BlockNodes",
    )


def blocklist_report(log: list[Recorded], job: str | None = None) -> ServiceReport:
    [report] = [s for s in replay(log, Settings(), job=job).services if s.service == "blocklist"]
    return report


def test_replay_over_every_jobs_findings_reproduces_the_fleet_commands() -> None:
    log, _ = fleet_log()
    report = blocklist_report(log)
    assert (report.differences, report.checked) == ([], 0)
    assert report.reproduced == report.recorded == 2  # a's own block, the fleet's to b


def test_replay_of_one_job_checks_the_fleet_commands_against_its_record() -> None:
    log, _ = fleet_log()
    report = blocklist_report(log, job="b")  # what b's archive holds: none of a's findings
    assert report.differences == []
    assert report.checked == 1 and "1 fleet commands checked" in report.line()


def _b_log_with(command: BlockNodes) -> list[Recorded]:
    log, original = fleet_log()
    swapped = [
        Recorded(i.topic, command if i.record == original else i.record)
        for i in log
        if i.record.job_id == "b" and not isinstance(i.record, CommandApplied)
    ]
    return [*swapped, Recorded(EVENTS_TOPIC, applied("b", command))]


def test_a_fleet_command_altered_or_outside_its_block_is_a_difference() -> None:
    _, original = fleet_log()
    other_host = dataclasses.replace(original, hosts=("h2",))
    [diff] = blocklist_report(_b_log_with(other_host), job="b").differences
    assert "not the command the fleet builds" in diff.describe()
    too_long = dataclasses.replace(original, until_ts=original.ts + 10 * MIN)
    [diff] = blocklist_report(_b_log_with(too_long), job="b").differences
    assert "not within one block duration" in diff.describe()


def test_a_fleet_command_applied_over_the_jobs_cap_is_a_difference() -> None:
    _, original = fleet_log()
    log = _b_log_with(original)
    # b held h2 and h3 already: a third of four hosts is over the 0.5 cap.
    held = [
        NodeBlocked(job_id="b", ts=10, id=f"b-blk-{h}", host=h, until_ts=MIN, cause="own")
        for h in ("h2", "h3")
    ]
    log[-1:-1] = [Recorded(EVENTS_TOPIC, e) for e in held]
    [diff] = blocklist_report(log, job="b").differences
    assert "would block 3 of 4 hosts, over blocklist.max-blocked-fraction" in diff.describe()


# --------------------------------------------------------------------------- opt-out during a run


@dataclass
class BlockingJob:
    """What the BlockNodes guard reads of a job."""

    settings: Settings
    pool: SlotPool = field(default_factory=SlotPool)
    max_blocked_fraction: float = 0.5

    @property
    def hosts(self) -> frozenset[str]:
        return frozenset(self.pool.hosts)


def guard_block(command: BlockNodes, settings: Settings) -> str | None:
    job = BlockingJob(settings)
    for host in B_HOSTS:
        job.pool.add_host(host, 1)
    return HANDLERS[BlockNodes].guard(command, job)  # type: ignore[arg-type]


def test_a_job_that_opted_out_refuses_the_fleets_blocks_during_its_run() -> None:
    _, to_b = fleet_log()
    opted_out = Settings({FLEET_SETTING: "false"})
    assert guard_block(to_b, opted_out) == (
        "job opted out of the fleet blocklist (blocklist.fleet = false)"
    )
    assert guard_block(to_b, Settings()) is None
    own = dataclasses.replace(to_b, cause="slow attempts on h1")
    assert guard_block(own, opted_out) is None  # its own evidence still blocks


def test_without_its_published_view_the_fleet_emits_no_tombstone_either() -> None:
    # Replay runs the core without the view (FleetBlock entries are not archived): an expiring
    # block used to still emit its tombstone there, a difference in every replay of a job that
    # outlived a fleet block.
    findings = [
        slow_finding(slow_on(0, "h1"), job_id="a", ts=1000, hosts=HOSTS, finding_id="f1"),
        slow_finding(slow_on(3, "h1"), job_id="a", ts=2000, hosts=HOSTS, finding_id="f2"),
        slow_finding(job_id="a", ts=2000 + MIN + 1, hosts=HOSTS, finding_id="f3"),
    ]
    for publish in (True, False):
        fleet = FleetBlocklist(Settings(), publish_view=publish)
        out = [o for f in findings for o in fleet.handle(f)]
        assert sent(out) == {"a": (("h1",), 2000 + MIN)}
        tombstones = [e.host for e in entries(out) if e.until_ts is None]
        assert tombstones == (["h1"] if publish else [])
        assert fleet.view() == {}
