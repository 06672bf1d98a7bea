"""Reading a dead driver's log (agent/adapters/job_log.py) from its archive alone: the events
in the driver's order, the commands by id, the torn tail left out; and the refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from tailguard.agent.adapters.job_log import read_recovery_log
from tailguard.agent.driver.recovery import RecoveryError
from tailguard.archive import ArchiveWriter
from tailguard.model import records as r
from tailguard.model.config import Settings


def test_the_archive_alone_gives_the_events_in_order_and_the_commands(tmp_path: Path) -> None:
    path = tmp_path / "job.avro"
    restart = r.RestartTasks(
        job_id="job", ts=3, id="failover-1", tasks=(), reason="x", not_before_ts=0
    )
    other_job = r.Tick(job_id="other", ts=1, id="other-e1")
    with ArchiveWriter(path, flush_every=1) as writer:
        for n in (1, 2):
            writer.append(
                r.EVENTS_TOPIC, "published", r.Tick(job_id="job", ts=n, id=f"job-e{n}"), n
            )
        writer.append(r.COMMANDS_TOPIC, "received", restart, 3)
        writer.append(r.EVENTS_TOPIC, "published", other_job, 3)
    with path.open("ab") as handle:  # a block cut short by the kill
        handle.write(b"\x02\x40" + b"\x00" * 5)
    log = read_recovery_log("job", str(path), Settings(), topics=False)
    assert [e.id for e in log.job_log.events] == ["job-e1", "job-e2"]
    assert log.job_log.commands == {"failover-1": restart}
    assert (log.not_archived, log.job_log.source) == ((), "the archive")


def test_no_archive_and_no_topics_is_nothing_to_recover(tmp_path: Path) -> None:
    with pytest.raises(RecoveryError, match=r"no archive at .* nothing to recover from"):
        read_recovery_log("job", str(tmp_path / "job.avro"), Settings(), topics=False)


def test_an_archive_that_is_not_one_is_named(tmp_path: Path) -> None:
    path = tmp_path / "job.avro"
    path.write_bytes(b"not an archive")
    with pytest.raises(RecoveryError, match=r"archive cannot be read.*bad magic"):
        read_recovery_log("job", str(path), Settings(), topics=False)
