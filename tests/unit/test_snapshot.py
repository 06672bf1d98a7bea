"""Service snapshots: the file round-trips, the retention rules drop what the cores drop, and a
service restored from a snapshot plus the tail decides exactly what one fed from offset 0 does
(the blocklist, whose snapshot is its core's state, over long histories on several partitions)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet_histories import HOSTS, Read, fleet_history, on_partitions, partition_of, slow_subtask
from speculation_histories import slow_finding

from tailguard.blocklist.fleet import FleetBlocklist
from tailguard.codec import codec_for
from tailguard.model import records as r
from tailguard.model.config import Settings
from tailguard.replay.inputs import read_archive
from tailguard.shell.processor import Processor
from tailguard.shell.snapshot import (
    SNAPSHOT_VERSION,
    PeriodicSnapshots,
    Position,
    Snapshot,
    SnapshotError,
    SnapshotStore,
    carried_over,
    digest,
)
from tailguard.system.retention import (
    STATE_PARTITION,
    CoreState,
    RecentJobs,
    Retained,
    UntilJobFinished,
)
from tailguard.system.services import SERVICE_NAMES, Service, service_named

DEMO = Path(__file__).parent / "recorded" / "demo-speculation.avro"
SETTINGS = Settings()
CODEC = codec_for(SETTINGS)


def demo(topic: str) -> list[r.Record]:
    return [item.record for item in read_archive(DEMO, SETTINGS) if item.topic == topic]


def three_jobs(topic: str) -> list[bytes]:
    """The demo job's input three times under other job ids: job a whole first (so it finishes
    early on the events topic), then b and c interleaved."""
    base = demo(topic)

    def as_job(job: str) -> list[r.Record]:
        return [dataclasses.replace(x, job_id=job, id=f"{job}-{x.id}") for x in base]

    a, b, c = as_job("job-a"), as_job("job-b"), as_job("job-c")
    mixed = [x for pair in zip(b, c, strict=True) for x in pair]
    return [CODEC.encode(x) for x in a + mixed]


def outputs(processor: Processor, inputs: list[bytes], first: int) -> Iterator[tuple[str, bytes]]:
    for offset, raw in enumerate(inputs[first:], start=first):
        for out in processor.process(raw, 0, offset):
            yield out.topic, out.value


@pytest.mark.parametrize("service", SERVICE_NAMES)
def test_restored_from_a_snapshot_decides_as_from_offset_zero(service: str, tmp_path: Path) -> None:
    definition = service_named(service)
    inputs = three_jobs(definition.input_topic)
    assert inputs, f"the demo archive has no input for {service}"
    whole = Processor(definition, SETTINGS, CODEC)
    expected = list(outputs(whole, inputs, 0))
    for cut in (len(inputs) // 3, len(inputs) // 2, len(inputs) - 3):
        before = Processor(definition, SETTINGS, CODEC)
        prefix_out = list(outputs(before, inputs[:cut], 0))
        store = SnapshotStore(tmp_path / f"{service}-{cut}.avro")
        store.write(before.snapshot())
        after = Processor(definition, SETTINGS, CODEC)
        after.restore(store.read(definition.name, definition.input_topic))  # type: ignore[arg-type]
        tail_out = list(outputs(after, inputs, cut))
        assert prefix_out + tail_out == expected, f"{service} cut at {cut} of {len(inputs)}"


def test_a_finished_jobs_input_leaves_the_snapshot() -> None:
    definition = service_named("decider")
    inputs = three_jobs(r.EVENTS_TOPIC)
    processor = Processor(definition, SETTINGS, CODEC)
    job_a = len(demo(r.EVENTS_TOPIC))
    list(outputs(processor, inputs[: job_a + 10], 0))
    kept = processor.snapshot()
    jobs = {CODEC.decode(x.value).job_id for x in kept.records}
    assert jobs == {"job-b", "job-c"}  # job a finished: nothing of it is kept
    assert len(kept.records) == 10
    assert kept.positions == {0: Position(job_a + 10, kept.positions[0].last_digest)}


def test_retention_rules() -> None:
    def rec(job: str, n: int, finished: bool = False) -> tuple[r.Record, Retained]:
        kind = r.JobFinished if finished else r.Tick
        extra = {"status": r.JobStatus.SUCCEEDED} if finished else {}
        record = kind(job_id=job, ts=n, id=f"{job}{n}", **extra)  # type: ignore[arg-type]
        return record, Retained(0, n, b"%d" % n)

    until = UntilJobFinished()
    for args in [("a", 0), ("b", 1), ("a", 2), ("a", 3, True), ("a", 4)]:
        until.keep(*rec(*args))  # type: ignore[arg-type]
    # a's records before its end are gone; a later record of the same id starts it afresh.
    assert sorted(x.offset for x in until.records()) == [1, 4]

    recent = RecentJobs(2)
    for args in [("a", 0), ("b", 1), ("c", 2), ("a", 3), ("d", 4)]:
        recent.keep(*rec(*args))  # type: ignore[arg-type]
    # a was active again after c; b and c fell out as later jobs came.
    assert sorted(x.offset for x in recent.records()) == [3, 4]
    with pytest.raises(ValueError, match="at least 1 job"):
        RecentJobs(0)


def test_snapshot_file_round_trips_and_names_what_is_wrong(tmp_path: Path) -> None:
    snapshot = Snapshot(
        "decider",
        r.EVENTS_TOPIC,
        {0: Position(7, "ab"), 3: Position(2, "cd")},
        (Retained(3, 1, b"y"), Retained(0, 5, b"x")),
    )
    store = SnapshotStore(tmp_path / "s.avro")
    assert store.read("decider", r.EVENTS_TOPIC) is None
    assert store.write(snapshot) > 0
    back = store.read("decider", r.EVENTS_TOPIC)
    assert back is not None
    assert back.positions == snapshot.positions
    assert back.records == tuple(sorted(snapshot.records))  # in reading order
    with pytest.raises(SnapshotError, match=r"a snapshot of decider on tailguard\.events, not"):
        store.read("detector", r.EVENTS_TOPIC)
    (tmp_path / "s.avro").write_bytes(b"garbage")
    with pytest.raises(SnapshotError, match="not a readable snapshot"):
        store.read("decider", r.EVENTS_TOPIC)
    assert SNAPSHOT_VERSION == 1  # a change of meaning bumps it (read refuses other versions)


def test_skips_input_a_restored_snapshot_already_holds() -> None:
    definition = service_named("decider")
    inputs = three_jobs(r.EVENTS_TOPIC)
    processor = Processor(definition, SETTINGS, CODEC)
    processor.restored_up_to = {0: len(inputs)}
    assert list(outputs(processor, inputs, 0)) == []
    assert processor.snapshot().records == ()


def test_periodic_snapshots_wait_for_the_answer(tmp_path: Path) -> None:
    taken: list[int] = []
    store = SnapshotStore(tmp_path / "p.avro")

    def take() -> Snapshot:
        taken.append(1)
        return Snapshot("decider", r.EVENTS_TOPIC, {}, ())

    snapshots = PeriodicSnapshots(store, take, every_records=2, every_s=1e9)
    for _ in range(4):
        snapshots.before_input()
        snapshots.after_input()
    snapshots.close()  # nothing new since the second: no snapshot at the stop
    assert len(taken) == 2
    snapshots.before_input()
    snapshots.after_input()
    snapshots.before_input()
    snapshots.close()  # an input handed to the core and not answered: none either
    assert len(taken) == 2
    snapshots.after_input()
    snapshots.close()  # answered: the stop takes one
    assert len(taken) == 3
    assert store.read("decider", r.EVENTS_TOPIC) is not None


def assert_decided_as_one_history(
    definition: Service, inputs: list[bytes], cut: int, moved: Snapshot
) -> None:
    """The rest of the input arrives on the new log from offset 0: a core restored from the
    carried-over state decides it exactly as one core fed the whole input does."""
    new = Processor(definition, SETTINGS, CODEC)
    new.restore(moved)
    whole = Processor(definition, SETTINGS, CODEC)
    list(outputs(whole, inputs[:cut], 0))
    expected = list(outputs(whole, inputs, cut))
    rest = [o for i, raw in enumerate(inputs[cut:]) for o in new.process(raw, 0, i)]
    assert [(o.topic, o.value) for o in rest] == expected


def test_state_carried_over_to_a_new_log_stays_before_it() -> None:
    definition = service_named("decider")
    inputs = three_jobs(r.EVENTS_TOPIC)
    old = Processor(definition, SETTINGS, CODEC)
    cut = len(inputs) // 2
    list(outputs(old, inputs[:cut], 0))
    moved = carried_over(old.snapshot())
    assert moved.positions == {}
    assert [x.offset for x in moved.records] == list(range(-len(moved.records), 0))
    assert [x.value for x in moved.records] == [x.value for x in sorted(old.snapshot().records)]
    assert_decided_as_one_history(definition, inputs, cut, moved)


def test_what_was_read_from_the_new_log_before_the_carry_over_is_read_again_once() -> None:
    """A service reads on after its broker came back empty (until the lost group stops it):
    those records sit in its state with the new log's offsets (from 0 again). Carried over as
    they were, they would be folded twice and sorted among the old log's records."""
    definition = service_named("decider")
    inputs = three_jobs(r.EVENTS_TOPIC)
    cut, read_on = len(inputs) // 2, 3
    old = Processor(definition, SETTINGS, CODEC)
    for i, raw in enumerate(inputs[:cut]):
        old.process(raw, 0, 100 + i)  # the old log, further along
    for i, raw in enumerate(inputs[cut : cut + read_on]):
        old.process(raw, 0, i)  # the new log, from 0
    new_log = {(0, i): digest(raw) for i, raw in enumerate(inputs[cut:])}
    moved = carried_over(
        old.snapshot(),
        lambda kept: new_log.get((kept.partition, kept.offset)) == digest(kept.value),
    )
    assert [x.value for x in moved.records] == [
        x.value for x in sorted(old.snapshot().records) if x.offset >= 100
    ]
    assert_decided_as_one_history(definition, inputs, cut, moved)


# --------------------------------------------------------------------------- the blocklist


def blocklist_input(history: list[Read]) -> list[tuple[int, int, bytes]]:
    return on_partitions(history, CODEC.encode)


def blocklist_outputs(processor: Processor, inputs: list[tuple[int, int, bytes]]) -> list[object]:
    return [
        (o.topic, o.key, o.value) for p, at, raw in inputs for o in processor.process(raw, p, at)
    ]


def slow_for_half_an_hour(start_ms: int) -> list[Read]:
    """h7 slow without a break across 15 jobs in a row, findings 1-3 s apart: its fleet block is
    extended every half duration for 30 minutes, an expiry chained to the first evidence."""
    reads, at = [], start_ms
    for i in range(900):
        at += (1_000, 2_000, 3_000)[(i * 7) % 3]
        job = f"long-{i // 60}"
        finding = slow_finding(
            slow_subtask(i % 5, ("h7",)),
            slow_subtask(1 + i % 5, ("h7",)),
            job_id=job,
            ts=at,
            hosts=HOSTS,
            finding_id=f"detector-{job}-{i}",
        )
        reads.append(Read(partition_of(job), finding))
    return reads


@pytest.mark.parametrize("seed", [1, 2])
def test_blocklist_restored_mid_history_decides_as_from_offset_zero(
    seed: int, tmp_path: Path
) -> None:
    """Jobs that end, evidence that ages out, blocks that expire and fleet blocks, on four
    partitions; then a host slow for half an hour across jobs. Refolding the input of the last
    window (or the whole input partition by partition, as a snapshot of input is folded) gives
    other commands here; the core's state does not."""
    history = fleet_history(60, seed)
    history += slow_for_half_an_hour(history[-1].finding.ts + 600_000)
    inputs = blocklist_input(history)
    definition = service_named("blocklist")
    expected = blocklist_outputs(Processor(definition, SETTINGS, CODEC), inputs)
    assert sum(1 for topic, _, _ in expected if topic == r.COMMANDS_TOPIC) > 100
    for cut in (len(inputs) // 4, len(inputs) // 2, len(inputs) - 450, len(inputs) - 100):
        before = Processor(definition, SETTINGS, CODEC)
        prefix_out = blocklist_outputs(before, inputs[:cut])
        store = SnapshotStore(tmp_path / f"blocklist-{seed}-{cut}.avro")
        store.write(before.snapshot())
        after = Processor(definition, SETTINGS, CODEC)
        snapshot = store.read(definition.name, definition.input_topic)
        assert snapshot is not None
        assert [x.partition for x in snapshot.records] == [STATE_PARTITION]  # no input kept
        after.restore(snapshot)
        assert prefix_out + blocklist_outputs(after, inputs[cut:]) == expected, f"cut at {cut}"


def test_blocklist_snapshot_stays_bounded_as_history_grows() -> None:
    """10x more jobs in the past, then the same recent jobs: the same state is held (jobs,
    evidence, blocks), and the snapshot is the same size but for the counters' digits."""
    definition = service_named("blocklist")
    held, sizes = [], []
    for old_jobs in (20, 200):
        history = fleet_history(old_jobs, seed=5, prefix="old")
        # The recent jobs come at one time for both, past every horizon after the last old
        # one (the same time: timestamps of as many digits).
        assert history[-1].finding.ts < 10**10
        recent = fleet_history(10, seed=6, start_ms=10**11)
        processor = Processor(definition, SETTINGS, CODEC)
        blocklist_outputs(processor, blocklist_input(history + recent))
        core = processor.core
        assert isinstance(core, FleetBlocklist)
        held.append(core.held())
        sizes.append(len(processor.snapshot().records[0].value))
    assert held[0] == held[1]
    assert held[1]["jobs"] <= 10
    assert sizes[1] <= sizes[0] + 32, sizes  # a few more digits in the counters, no more


def test_a_core_state_is_carried_over_as_it_is_and_needs_a_stateful_core() -> None:
    definition = service_named("blocklist")
    processor = Processor(definition, SETTINGS, CODEC)
    blocklist_outputs(processor, blocklist_input(fleet_history(5, seed=1)))
    snapshot = processor.snapshot()
    moved = carried_over(snapshot)
    assert moved.records == snapshot.records and moved.positions == {}
    with pytest.raises(TypeError, match="CoreState needs a core with export_state"):
        CoreState().attach(object())
    with pytest.raises(ValueError, match="not a blocklist state: version 99"):
        FleetBlocklist(SETTINGS).import_state(b'{"version": 99}')
    with pytest.raises(ValueError, match="not a blocklist state"):
        FleetBlocklist(SETTINGS).import_state(b'{"version": 1, "per_job": {}}')
