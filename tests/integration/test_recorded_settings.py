"""An archive replays on its own (issue 28, item 1): two real jobs on Spark `local[2]` with the
five services as processes on the broker, the decider's setting changed between them (the
services restarted with it), and each job's archive replayed with no settings file: 0
differences, each job's decisions under the settings its services recorded.

Each job asks for another value of the setting than the services run with: a service's own
setting wins (`Settings.for_job`), so the job's config alone cannot replay its decisions, as the
control shows. Both services' settings differ from the defaults.

About a minute (two starts of the services, two jobs), so not in `make test`:
`make test-audit` (TAILGUARD_AUDIT_E2E=1). Its short case in `make test` is
tests/unit/test_replay_recorded_settings.py (the same two jobs through the services' real
processors, without Kafka and Spark).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tailguard.cli import main
from tailguard.examples import sales_by_region as example
from tailguard.model import records as r
from tailguard.model.config import Settings
from tailguard.replay.engine import replay
from tailguard.replay.inputs import read_archive
from tailguard.testing import Harness, run_job
from tailguard.testing.markers import ServicesRequest

AVG = "execution.batch.adaptive.auto-parallelism.avg-data-volume-per-task"
SERVICES = {"execution.batch.adaptive.auto-parallelism.max-parallelism": "8"}
HEAD = "sales→score→partial"

pytestmark = [
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("TAILGUARD_AUDIT_E2E") != "1",
        reason="two jobs with the services restarted between them: make test-audit "
        "(TAILGUARD_AUDIT_E2E=1)",
    ),
]


def _run(harness: Harness, spark: Any, data: Path, work: Path, avg: str) -> tuple[Any, Path]:
    services = harness.services(ServicesRequest(tuple(sorted({**SERVICES, AVG: avg}.items()))))
    out = work / "out"
    job = example.make_job(data, out, name=work.name)
    run = run_job(job, spark, work, services=services, settings={AVG: "1 MiB"})
    assert run.result.ok, run.result.summary()
    expected = example.reference(data)
    assert example.read_output(out)[expected.columns.tolist()].equals(expected)
    return run.result, Path(run.result.archive)


def test_two_jobs_replay_exactly_with_no_settings_file_though_a_service_setting_changed(
    tailguard_harness: Harness,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    spark = tailguard_harness.local_spark_of(request.node)
    data = example.generate(tmp_path / "data", files=4, rows_per_file=3_000)
    runs = [
        _run(tailguard_harness, spark, data, tmp_path / "first", "64 KiB"),
        _run(tailguard_harness, spark, data, tmp_path / "second", "16 KiB"),
    ]
    # The services decided, each job under its services' setting (not the job's 1 MiB).
    decided = [result.parallelism[HEAD] for result, _ in runs]
    assert [by for _, by in decided] == ["decider", "decider"], decided
    assert decided[0][0] != decided[1][0] and min(p for p, _ in decided) > 1, decided

    versions = []
    for _, archive in runs:
        capsys.readouterr()
        assert main(["replay", str(archive)]) == 0, capsys.readouterr().out
        said = capsys.readouterr().out
        assert "settings: as the services recorded them in the log" in said, said
        log = list(read_archive(archive, Settings()))
        report = replay(log, Settings())
        assert report.differences == 0, [s.line() for s in report.services]
        assert all(plan.recorded for plan in report.settings)
        (decider,) = [
            x.record
            for x in log
            if isinstance(x.record, r.CommandSettings) and x.record.service == "decider"
        ]
        assert {*SERVICES, AVG} <= set(decider.explicit)
        versions.append((decider.version, decider.settings[AVG]))
        # The control: without what the services recorded, the job's config does not replay it.
        before = [x for x in log if not isinstance(x.record, r.PolicySettings)]
        assert replay(before, Settings()).differences > 0
    assert versions[0][0] != versions[1][0]
    assert [avg for _, avg in versions] == ["64 KiB", "16 KiB"]
