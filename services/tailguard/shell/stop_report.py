"""What a service stopping without its broker could not flush, told to `tailguard services down`.

A service stopped while its broker is unreachable exits at once rather than wait for faust's
shutdown (tailguard.shell.worker). Two things then stay off the broker: the outputs of the input
it was answering (sent, not yet confirmed), and its consumer offsets since the last commit the
broker confirmed. Neither loses a decision - the outputs are made again at the next start under
the same ids, and uncommitted input is either covered by the snapshot written at the stop or
processed again - but the operator stopping it should hear what happened, not just "stopped".

The worker writes a `StopReport` next to its announcement (`<work>/services/NAME.stopped.json`)
before it exits; `supervisor.stop` reads it once the process is gone and says it in its line.
Stdlib only: `services down` runs without the services extra.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class StopReport:
    pid: int
    # Why the broker counts as gone (the broker watch's reason).
    broker: str
    # Outputs sent for the input being answered whose delivery the broker had not confirmed, and
    # that input ("topic[partition]@offset"; empty when none).
    unconfirmed_outputs: int
    answering: str
    # Inputs processed since the last offsets the broker confirmed as committed.
    uncommitted_inputs: int
    # Whether the snapshot written at the stop covers the processed input (else the next start
    # reads it from the topic again), and what happened to the snapshot.
    snapshot_covers_input: bool
    snapshot: str

    def describe(self) -> str:
        """One line: what stayed off the broker and what the next start does about it."""
        parts: list[str] = []
        if self.unconfirmed_outputs:
            parts.append(
                f"{self.unconfirmed_outputs} output(s) answering {self.answering} not confirmed "
                "by the broker (made again at the next start, under the same ids)"
            )
        if self.uncommitted_inputs:
            then = (
                "the snapshot holds them: not processed again"
                if self.snapshot_covers_input
                else "processed again at the next start"
            )
            parts.append(f"offsets of {self.uncommitted_inputs} input(s) not committed ({then})")
        unflushed = "; ".join(parts) if parts else "nothing"
        return (
            f"stopped without its broker ({self.broker}); not flushed: {unflushed}; {self.snapshot}"
        )


class FlushTracker:
    """What of a service's work the broker has confirmed, kept by its stream as it goes (a few
    attribute writes per input): the outputs of the input being answered, how far input was
    processed, and the offsets whose commit the broker confirmed."""

    def __init__(self) -> None:
        self.unconfirmed = 0
        self.answering = ""
        self.processed_to: dict[int, int] = {}  # partition -> next offset processed
        self.committed_to: dict[int, int] = {}  # partition -> next offset, as committed

    def outputs_sent(self, where: str, count: int) -> None:
        self.answering, self.unconfirmed = where, count

    def output_confirmed(self) -> None:
        self.unconfirmed -= 1

    def answered(self, partition: int, offset: int) -> None:
        self.unconfirmed, self.answering = 0, ""
        self.processed_to[partition] = offset + 1

    def committed(self, offsets: dict[int, int]) -> None:
        """Offsets the broker confirmed as committed (also those read at the start)."""
        self.committed_to.update(offsets)

    def uncommitted_inputs(self) -> int:
        return sum(
            max(0, at - self.committed_to.get(partition, 0))
            for partition, at in self.processed_to.items()
        )

    def report(self, pid: int, broker: str, snapshot_written: bool, snapshot: str) -> StopReport:
        return StopReport(
            pid=pid,
            broker=broker,
            unconfirmed_outputs=self.unconfirmed,
            answering=self.answering,
            uncommitted_inputs=self.uncommitted_inputs(),
            snapshot_covers_input=snapshot_written,
            snapshot=snapshot,
        )


def report_path(services_dir: Path, name: str) -> Path:
    return services_dir / f"{name}.stopped.json"


def write(services_dir: Path, name: str, report: StopReport) -> None:
    path = report_path(services_dir, name)
    aside = path.with_suffix(".tmp")
    aside.write_text(json.dumps(asdict(report)))
    aside.replace(path)


def take(services_dir: Path, name: str, pid: int) -> StopReport | None:
    """The report the process `pid` left (then removed), None if it left none (it stopped with
    its broker there, was killed, or is an older release)."""
    path = report_path(services_dir, name)
    try:
        raw = json.loads(path.read_text())
        report = StopReport(**raw)
    except (FileNotFoundError, ValueError, TypeError):
        return None
    path.unlink(missing_ok=True)
    return report if report.pid == pid else None
