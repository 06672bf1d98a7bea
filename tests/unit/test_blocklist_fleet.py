"""FleetBlocklist: one view of slow hosts across jobs, published as FleetBlock changes.

Defaults: two distinct slow subtasks within the evidence window block a host."""

from __future__ import annotations

from speculation_histories import slow_finding

from tailguard.blocklist.fleet import FleetBlocklist
from tailguard.blocklist.policy import BlocklistTracker
from tailguard.model.config import Settings
from tailguard.model.fleet import FLEET_CAUSE_PREFIX, FleetBlock, current_entries
from tailguard.model.records import BlockNodes, Record, SlowAttempt, SlowSubtask

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
