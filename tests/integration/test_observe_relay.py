"""The relay process as the listener drives it: settings, then the application, then Spark's
events on stdin; the application's archive holds the translated events, Ticks included. Archive
mode (no broker), in a real `python -m tailguard.observer.relay` process."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tailguard.archive import ArchiveReader
from tailguard.model import records as r

LINES = [
    "C|tailguard.observe.log-mode|archive",
    "C|slow-task-detector.check-interval|100 ms",
    "C|s3.secret-key|not-to-be-recorded",
    # Spark posts the driver's ExecutorAdded before ApplicationStart.
    "X|0|driver|d|2",
    "A|0|app-7|sales",
    "X|1|1|a|2",
    "J|10|0|1",
    "G|0|0|2||parquet at job.py:3",
    "TS|20|1|0|0|0|0|0|1|a|0",
    "TS|20|2|0|0|1|1|0|1|a|0",
    "TE|40|1|0|0|Success|10|1|-1|-1|",
    "TE|50|2|0|0|Success|10|1|-1|-1|",
    "JE|60|0|SUCCEEDED",
    "E|70",
]


def test_the_relay_archives_an_applications_jobs(tmp_path: Path) -> None:
    lines = [f"C|tailguard.archive-dir|{tmp_path}", *LINES]
    stdin = "".join(line.replace("|", "\t") + "\n" for line in lines)
    done = subprocess.run(
        [sys.executable, "-m", "tailguard.observer.relay"],
        input=stdin.encode(),
        capture_output=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr.decode()
    records = [e.record for e in ArchiveReader(tmp_path / "app-7.avro")]
    kinds = [type(x).__name__ for x in records if not isinstance(x, r.Tick)]
    assert kinds == [
        "JobSubmitted",
        "NodeAdded",
        "VertexInitialized",
        "AttemptDeploying",
        "AttemptDeploying",
        "AttemptFinished",
        "AttemptFinished",
        "JobFinished",
    ]
    submitted = records[0]
    assert isinstance(submitted, r.JobSubmitted) and submitted.job_id == "app-7-job-0"
    # Policy settings are recorded for the replay; connection settings and secrets never are.
    assert submitted.config["slow-task-detector.check-interval"] == "100 ms"
    assert not any("s3" in k or "archive" in k for k in submitted.config)
    assert b"not-to-be-recorded" not in (tmp_path / "app-7.avro").read_bytes()
    # Settings lines are the relay's; the application's eleven lines were all translated.
    assert b"app-7: 11 lines, 0 ignored, 0 malformed" in done.stderr
    # ...and its own CPU, which the overhead benchmark sets beside the application's.
    cpu = re.search(rb"relay CPU ([0-9.]+) s", done.stderr)
    assert cpu is not None and 0 < float(cpu.group(1)) < 60
