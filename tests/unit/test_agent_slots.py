"""Slot pool: FIFO service, bulk regions (FLIP-119), blocked hosts, avoided hosts, slot ids."""

from __future__ import annotations

from tailguard.agent.driver.slots import (
    ExecutionVertexId,
    RegionRequest,
    Slot,
    SlotPool,
    SlotRequest,
    SpeculativeRequest,
    TaskRequest,
)


def pool(**hosts: int) -> SlotPool:
    p = SlotPool()
    for name, slots in hosts.items():
        p.add_host(name, slots)
    return p


def task(n: int, vertex: str = "v") -> ExecutionVertexId:
    return ExecutionVertexId(vertex, n)


def single(n: int, **kw: object) -> SlotRequest:
    return SlotRequest(key=TaskRequest(task(n)), tasks=[task(n)], **kw)  # type: ignore[arg-type]


def hosts_of(served: list[tuple[SlotRequest, dict[ExecutionVertexId, Slot]]]) -> list[dict]:
    return [{t: s.host for t, s in placed.items()} for _, placed in served]


def used(p: SlotPool, host: str) -> int:
    return len(p.hosts[host].busy)


def test_one_slot_per_runner_and_least_loaded_host_first() -> None:
    p = pool(a=2, b=1)
    for n in range(3):
        p.request(single(n))
    served = p.assign(now=0)
    assert [req.key for req, _ in served] == [TaskRequest(task(n)) for n in range(3)]
    # Most free slots first (a has 2), then the name breaks ties (a and b have 1 each).
    assert hosts_of(served) == [{task(0): "a"}, {task(1): "a"}, {task(2): "b"}]
    slots = [s for _, placed in served for s in placed.values()]
    assert sorted(s.slot_id for s in slots) == ["a/0", "a/1", "b/0"]  # each slot once
    p.request(single(9))
    assert p.assign(now=0) == []  # all slots used
    p.release("b/0")
    assert [placed for _, placed in p.assign(now=0)] == [{task(9): Slot("b", "b/0")}]


def test_a_released_slot_is_the_one_handed_out_next() -> None:
    p = pool(a=3)
    served = p.assign(now=0)
    assert served == []
    for n in range(3):
        p.request(single(n))
    placed = {t: s for _, pl in p.assign(now=0) for t, s in pl.items()}
    assert [placed[task(n)].slot_id for n in range(3)] == ["a/0", "a/1", "a/2"]
    p.release("a/1")
    p.request(single(3))
    (only,) = p.assign(now=0)
    assert only[1] == {task(3): Slot("a", "a/1")}


def test_slots_come_and_go_with_their_runners() -> None:
    p = SlotPool()
    assert p.add_slot("a", "r1") is True  # a new host
    assert p.add_slot("a", "r2") is False
    assert p.add_slot("a", "r2") is False  # the same runner again: still two slots
    assert p.total_slots() == 2 and p.host_of("r2") == "a"
    p.request(single(0))
    ((_, placed),) = p.assign(now=0)
    assert placed[task(0)] == Slot("a", "r1")  # the first runner to connect
    assert p.remove_slot("r1") == ("a", False)  # busy slot lost; its host keeps r2
    assert p.hosts["a"].busy == set()
    assert p.remove_slot("r2") == ("a", True)  # the last one: the host is gone
    assert "a" not in p.hosts and p.total_slots() == 0
    assert p.remove_slot("r2") == (None, False)  # unknown or already removed
    p.release("r1")  # releasing a removed slot is harmless


def test_blocked_hosts_get_no_new_attempts_and_expire() -> None:
    p = pool(a=1, b=1)
    p.block("a", until=100)
    p.request(single(1))
    p.request(single(2))
    assert hosts_of(p.assign(now=0)) == [{task(1): "b"}]
    assert p.blocked() == ["a"]
    assert p.expired_blocks(99) == []
    assert p.expired_blocks(100) == ["a"]
    p.unblock("a")
    assert p.blocked() == []
    assert hosts_of(p.assign(now=100)) == [{task(2): "a"}]


def test_avoided_hosts_are_skipped_even_when_free() -> None:
    p = pool(a=1, b=1)
    t, u = task(0, "t"), task(0, "u")
    p.request(
        SlotRequest(key=SpeculativeRequest(t, "c1", 0), tasks=[t], avoid={t: frozenset("ab")})
    )
    assert p.assign(now=0) == []
    p.request(SlotRequest(key=SpeculativeRequest(u, "c2", 0), tasks=[u], avoid={u: frozenset("a")}))
    assert hosts_of(p.assign(now=0)) == [{u: "b"}]
    # The one that can never be placed here is still queued, and can be dropped.
    assert [q.key for q in p.pending()] == [SpeculativeRequest(t, "c1", 0)]
    p.cancel_speculative(t)
    assert p.pending() == []


def test_bulk_request_waits_for_all_its_slots_and_oldest_fulfillable_goes_first() -> None:
    p = pool(a=1, b=1)
    region = [task(2), task(3)]
    p.request(single(1))
    p.request(SlotRequest(key=RegionRequest(region[0]), tasks=region))
    served = p.assign(now=0)
    assert [req.key for req, _ in served] == [TaskRequest(task(1))]
    # The region needs two slots at once: it must not take one and hold it.
    assert used(p, "a") + used(p, "b") == 1
    p.release(served[0][1][task(1)].slot_id)
    served = p.assign(now=0)
    assert [req.key for req, _ in served] == [RegionRequest(task(2))]
    assert sorted(s.host for s in served[0][1].values()) == ["a", "b"]
    assert used(p, "a") + used(p, "b") == 2


def test_a_younger_request_is_served_when_the_older_bulk_cannot_be() -> None:
    """FIFO among what fits: a bulk that cannot be placed does not hold back smaller requests
    (Flink's bulk allocation; the driver waits for the cluster to grow if it never fits)."""
    p = pool(a=1)
    p.request(SlotRequest(key=RegionRequest(task(0)), tasks=[task(0), task(1)]))
    p.request(single(5))
    assert [q.key for q, _ in p.assign(now=0)] == [TaskRequest(task(5))]
    assert [q.key for q in p.pending()] == [RegionRequest(task(0))]


def test_not_before_delays_a_request() -> None:
    p = pool(a=1)
    p.request(single(1, not_before=50))
    assert p.assign(now=49) == []
    assert len(p.assign(now=50)) == 1


def test_queued_keys_and_cancel() -> None:
    p = pool(a=1)
    p.request(single(1, not_before=10))
    p.request(single(2, not_before=10))
    assert p.queued_keys() == {TaskRequest(task(1)), TaskRequest(task(2))}
    p.cancel(TaskRequest(task(1)))
    assert p.queued_keys() == {TaskRequest(task(2))}


def test_could_ever_place_ignores_current_use_and_blocks() -> None:
    p = pool(a=1, b=1)
    p.block("a", until=10)
    p.request(single(0))
    p.assign(now=0)
    assert p.could_ever_place(SlotRequest(key=RegionRequest(task(1)), tasks=[task(1), task(2)]))
    assert not p.could_ever_place(
        SlotRequest(key=RegionRequest(task(1)), tasks=[task(1), task(2), task(3)])
    )
    # Nothing changed by asking.
    assert p.hosts["a"].blocked_until == 10 and used(p, "b") == 1 and used(p, "a") == 0
