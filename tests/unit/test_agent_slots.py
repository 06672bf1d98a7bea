"""Slot pool: FIFO service, bulk regions, blocked hosts, avoided hosts."""

from tailguard.agent.driver.slots import SlotPool, SlotRequest


def pool(**hosts: int) -> SlotPool:
    p = SlotPool()
    for name, slots in hosts.items():
        p.add_host(name, slots)
    return p


def test_one_slot_per_core_and_least_loaded_host_first():
    p = pool(a=2, b=1)
    for n in range(3):
        p.request(SlotRequest(key=n, tasks=[n]))
    served = p.assign(now=0)
    hosts = [placed[n] for (_, placed), n in zip(served, range(3), strict=False)]
    assert sorted(hosts) == ["a", "a", "b"]
    p.request(SlotRequest(key=9, tasks=[9]))
    assert p.assign(now=0) == []  # all slots used
    p.release("b")
    served = p.assign(now=0)
    assert [placed for _, placed in served] == [{9: "b"}]


def test_blocked_hosts_get_no_new_attempts_and_expire():
    p = pool(a=1, b=1)
    p.block("a", until=100)
    p.request(SlotRequest(key=1, tasks=[1]))
    p.request(SlotRequest(key=2, tasks=[2]))
    served = p.assign(now=0)
    assert [placed for _, placed in served] == [{1: "b"}]
    assert p.expired_blocks(99) == []
    assert p.expired_blocks(100) == ["a"]
    p.unblock("a")
    assert [placed for _, placed in p.assign(now=100)] == [{2: "a"}]


def test_avoided_hosts_are_skipped_even_when_free():
    p = pool(a=1, b=1)
    p.request(SlotRequest(key=1, tasks=["t"], avoid={"t": frozenset({"a", "b"})}))
    assert p.assign(now=0) == []
    p.request(SlotRequest(key=2, tasks=["u"], avoid={"u": frozenset({"a"})}))
    assert [placed for _, placed in p.assign(now=0)] == [{"u": "b"}]


def test_bulk_request_waits_for_all_its_slots_and_oldest_fulfillable_goes_first():
    p = pool(a=1, b=1)
    p.request(SlotRequest(key="small", tasks=[1]))
    p.request(SlotRequest(key="region", tasks=[2, 3]))
    served = p.assign(now=0)
    assert [req.key for req, _ in served] == ["small"]
    # The region needs two slots at once: it must not take one and hold it.
    assert p.hosts["a"].used + p.hosts["b"].used == 1
    p.release(served[0][1][1])
    served = p.assign(now=0)
    assert [req.key for req, _ in served] == ["region"]
    assert sorted(served[0][1].values()) == ["a", "b"]


def test_not_before_delays_a_request():
    p = pool(a=1)
    p.request(SlotRequest(key=1, tasks=[1], not_before=50))
    assert p.assign(now=49) == []
    assert len(p.assign(now=50)) == 1


def test_could_ever_place_ignores_current_use_and_blocks():
    p = pool(a=1, b=1)
    p.block("a", until=10)
    p.request(SlotRequest(key=0, tasks=[0]))
    p.assign(now=0)
    assert p.could_ever_place(SlotRequest(key=1, tasks=[1, 2]))
    assert not p.could_ever_place(SlotRequest(key=2, tasks=[1, 2, 3]))
    assert p.hosts["a"].blocked_until == 10 and p.hosts["b"].used == 1
