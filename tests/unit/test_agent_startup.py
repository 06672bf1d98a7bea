"""The job's start (issue 24, item 5): the first attempts go to the hosts whose runners have
connected, without waiting for a straggling host, and the blocks that hold at the start (the
fleet list's, a recovered job's) reach a host whose runners connect later."""

from __future__ import annotations

from pathlib import Path

from agent_fakes import FakeRuntime, Harness, write_parquet_input

from tailguard.agent.driver.ports import Post, RunnerConnected
from tailguard.agent.driver.slots import SlotPool
from tailguard.agent.executor.storage import Storage
from tailguard.agent.graph.api import Job
from tailguard.model import records as r
from tailguard.model.fleet import FleetBlock

S = "src"


class Straggling(FakeRuntime):
    """Runners launched on every host of `slots`; only those of `first` connect at start, the
    others when the test says (`join`)."""

    def __init__(self, slots: list[tuple[str, str]], first: set[str]) -> None:
        super().__init__(slots)
        self.first = first

    def start(self, job_id: str, post: Post) -> int:
        self.job_id, self.post = job_id, post
        for host, slot in self.slots:
            if host in self.first:
                post(RunnerConnected(slot, host, 1))
        return len(self.slots)

    def join(self, h: Harness, host: str) -> None:
        for name, slot in self.slots:
            if name == host:
                h.post(RunnerConnected(slot, host, 1))


def three_subtasks(tmp_path: Path, runtime: FakeRuntime) -> Harness:
    job = Job("start")
    source = job.read_parquet(
        str(write_parquet_input(tmp_path / "in.parquet", rows=30, row_groups=3)), name=S
    )
    source.with_parallelism(3).write_parquet(str(tmp_path / "out"), name="out", parallelism=3)
    return Harness(job, runtime, Storage(str(tmp_path / "st")))


def test_the_first_attempts_do_not_wait_for_a_host_whose_runners_are_late(
    tmp_path: Path,
) -> None:
    runtime = Straggling([("h1", "h1/s0"), ("h2", "h2/s0"), ("h3", "h3/s0")], first={"h1"})
    h = three_subtasks(tmp_path, runtime).start()
    try:
        # h2 and h3 have not connected: h1 runs the first subtask at once, not after them.
        assert runtime.wait_deployed(1, timeout=2.0)
        assert [d.slot for d in runtime.deployed] == ["h1/s0"]
        runtime.join(h, "h3")
        runtime.join(h, "h2")
        assert runtime.wait_deployed(3, timeout=2.0)
        assert sorted(d.slot for d in runtime.deployed) == ["h1/s0", "h2/s0", "h3/s0"]
        added = [e.host for e in h.publisher.of(r.NodeAdded)]
        assert added == ["h1", "h3", "h2"]
    finally:
        h.stop()


def test_runners_that_connected_together_are_all_seen_by_the_first_placement(
    tmp_path: Path,
) -> None:
    # What was already posted is taken before placing: one attempt per host, as before.
    runtime = Straggling([("h1", "h1/s0"), ("h2", "h2/s0"), ("h3", "h3/s0")], first={"h1", "h2"})
    h = three_subtasks(tmp_path, runtime).start()
    try:
        assert runtime.wait_deployed(2, timeout=2.0)
        assert sorted(d.slot for d in runtime.deployed) == ["h1/s0", "h2/s0"]
    finally:
        h.stop()


def test_a_fleet_listed_host_that_joins_late_gets_no_attempt(tmp_path: Path) -> None:
    runtime = Straggling([("h1", "h1/s0"), ("h2", "h2/s0"), ("h3", "h3/s0")], first={"h1"})
    h = three_subtasks(tmp_path, runtime)
    far = 2**62
    listed = FleetBlock(job_id="x", ts=0, id="blocklist-f1", host="h2", until_ts=far)
    h.driver.options.fleet_list = lambda: [listed]
    h.start()
    try:
        # The cap counts the three hosts with executors, not the one joined: h2 is blocked.
        blocked = h.publisher.of(r.NodeBlocked)
        assert [(b.host, b.command_id) for b in blocked] == [("h2", "blocklist-f1")]
        runtime.join(h, "h2")
        runtime.join(h, "h3")
        assert runtime.wait_deployed(2, timeout=2.0)
        assert sorted(d.slot for d in runtime.deployed) == ["h1/s0", "h3/s0"]
    finally:
        h.stop()


def test_the_pool_holds_a_block_until_its_host_joins_and_while_it_is_gone() -> None:
    pool = SlotPool()
    pool.add_host("h1", 1)
    pool.block("h2", until=100)
    # Not in the pool yet, but blocked: it counts against the cap and expires at its time.
    assert pool.blocked() == ["h2"]
    assert pool.expired_blocks(99) == [] and pool.expired_blocks(100) == ["h2"]
    pool.add_slot("h2", "h2/s0")
    assert pool.blocked() == ["h2"]
    assert pool.hosts["h2"].free == 1 and pool.hosts["h2"].blocked_until == 100
    # Its only runner is lost and replaced: the host is still blocked.
    assert pool.remove_slot("h2/s0") == ("h2", True)
    pool.add_slot("h2", "h2/s1")
    assert pool.blocked() == ["h2"]
    # Unblocked while absent: it joins unblocked.
    pool.remove_slot("h2/s1")
    pool.unblock("h2")
    assert pool.blocked() == []
    pool.add_slot("h2", "h2/s2")
    assert pool.blocked() == []
