"""What a service stopped without its broker says it could not flush (tailguard.shell.stop_report):
the tracker its stream keeps, the line `services down` prints, and the file between them."""

from __future__ import annotations

from pathlib import Path

from tailguard.shell import stop_report
from tailguard.shell.stop_report import FlushTracker, StopReport

BROKER = "no broker answered within 2 s (timed out)"


def test_nothing_unflushed_when_every_output_and_offset_was_confirmed() -> None:
    tracker = FlushTracker()
    tracker.committed({0: 3})  # read at the start
    for offset in (3, 4):
        tracker.outputs_sent(f"tailguard.events[0]@{offset}", 1)
        tracker.output_confirmed()
        tracker.answered(0, offset)
    tracker.committed({0: 5})
    report = tracker.report(41, BROKER, True, "snapshot written to /w/s.avro")
    assert report.describe() == (
        f"stopped without its broker ({BROKER}); not flushed: nothing; "
        "snapshot written to /w/s.avro"
    )


def test_uncommitted_input_and_unconfirmed_outputs_are_counted() -> None:
    tracker = FlushTracker()
    tracker.committed({0: 10, 1: 4})
    for partition, offset in ((0, 10), (0, 11), (1, 4), (0, 12)):
        tracker.outputs_sent(f"tailguard.events[{partition}]@{offset}", 0)
        tracker.answered(partition, offset)
    tracker.committed({0: 11})  # the broker confirmed one more on partition 0, then went away
    tracker.outputs_sent("tailguard.events[1]@5", 3)
    tracker.output_confirmed()  # one of its three outputs reached the broker
    report = tracker.report(41, BROKER, False, "the last snapshot kept (/w/s.avro)")
    assert (report.unconfirmed_outputs, report.uncommitted_inputs) == (2, 3)
    assert report.describe() == (
        f"stopped without its broker ({BROKER}); not flushed: 2 output(s) answering "
        "tailguard.events[1]@5 not confirmed by the broker (made again at the next start, "
        "under the same ids); offsets of 3 input(s) not committed (processed again at the "
        "next start); the last snapshot kept (/w/s.avro)"
    )


def test_a_partition_never_committed_counts_from_its_start() -> None:
    tracker = FlushTracker()
    tracker.committed({})  # a new group: nothing committed
    tracker.answered(2, 0)
    tracker.answered(2, 1)
    assert tracker.uncommitted_inputs() == 2
    covered = tracker.report(7, BROKER, True, "snapshot written to x").describe()
    assert "offsets of 2 input(s) not committed (the snapshot holds them: not processed again)" in (
        covered
    )


def test_the_report_is_taken_once_and_only_by_its_own_process(tmp_path: Path) -> None:
    report = StopReport(41, BROKER, 0, "", 1, True, "snapshot written to x")
    stop_report.write(tmp_path, "decider", report)
    assert stop_report.take(tmp_path, "decider", 99) is None  # another process's leftover
    stop_report.write(tmp_path, "decider", report)
    assert stop_report.take(tmp_path, "decider", 41) == report
    assert stop_report.take(tmp_path, "decider", 41) is None  # taken: gone
    (tmp_path / "detector.stopped.json").write_text("{broken")
    assert stop_report.take(tmp_path, "detector", 41) is None
