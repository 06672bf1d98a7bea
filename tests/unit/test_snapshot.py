"""Service snapshots: the file round-trips, the retention rules drop what the cores drop, and a
service restored from a snapshot plus the tail decides exactly what one fed from offset 0 does."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from tailguard.codec import codec_for
from tailguard.model import records as r
from tailguard.model.config import Settings
from tailguard.replay.inputs import read_archive
from tailguard.shell.definition import SERVICE_NAMES, load_definition
from tailguard.shell.processor import Processor
from tailguard.shell.retention import RecentJobs, Retained, UntilJobFinished
from tailguard.shell.snapshot import (
    SNAPSHOT_VERSION,
    PeriodicSnapshots,
    Position,
    Snapshot,
    SnapshotError,
    SnapshotStore,
    carried_over,
)

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
    definition = load_definition(service)
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
    definition = load_definition("decider")
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
    definition = load_definition("decider")
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


def test_state_carried_over_to_a_new_log_stays_before_it() -> None:
    definition = load_definition("decider")
    inputs = three_jobs(r.EVENTS_TOPIC)
    old = Processor(definition, SETTINGS, CODEC)
    cut = len(inputs) // 2
    list(outputs(old, inputs[:cut], 0))
    moved = carried_over(old.snapshot())
    assert moved.positions == {}
    assert [x.offset for x in moved.records] == list(range(-len(moved.records), 0))
    assert [x.value for x in moved.records] == [x.value for x in sorted(old.snapshot().records)]
    # The rest of the input arrives on the new log from offset 0: decided as one history.
    new = Processor(definition, SETTINGS, CODEC)
    new.restore(moved)
    whole = Processor(definition, SETTINGS, CODEC)
    list(outputs(whole, inputs[:cut], 0))
    expected = list(outputs(whole, inputs, cut))
    rest = [o for i, raw in enumerate(inputs[cut:]) for o in new.process(raw, 0, i)]
    assert [(o.topic, o.value) for o in rest] == expected
