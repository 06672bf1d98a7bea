"""The chaos suite's one case in the default run (`make test`): garbage and forged records on
the topics the agent reads (commands and findings) mid-job, on local[2] with the five services.
The whole suite is `make chaos` (tests/chaos/test_chaos.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.chaos.faults import ForgedRecords
from tests.chaos.toolkit import CaseResult, run_case, sales_data

from tailguard.demo import DEMO_POLICY
from tailguard.model import records as r
from tailguard.testing import Services

pytestmark = [pytest.mark.spark, pytest.mark.tailguard_services(settings=DEMO_POLICY)]


def test_garbage_and_forged_decisions_for_the_agent_change_nothing(
    tailguard_local_spark: Any,
    tailguard_services: Services,
    tmp_path: Path,
    chaos_report: list[CaseResult],
) -> None:
    settings = dict(tailguard_services.settings.overrides())
    fault = ForgedRecords(settings, topics=[r.COMMANDS_TOPIC, r.FINDINGS_TOPIC])
    result = CaseResult("garbage-commands-findings-local2")
    chaos_report.append(result)
    data = sales_data(tmp_path / "data", files=3, rows=2_000)
    run = run_case(
        result,
        fault,
        data,
        tailguard_local_spark,
        tailguard_services,
        tmp_path / "run",
        work_per_row=0,
        replay_ignores=fault.is_forged,
    )
    assert run is not None, result.outcome
    assert not result.missed(), f"{result.missed()}: {result.note}"
    # The agent read the forged commands for its job and rejected each one; none applied.
    forged = {
        x.id for x in fault.forged if isinstance(x, r.Command) and x.job_id == run.result.job_id
    }
    rejected = {e.command_id for e in run.of(r.CommandRejected)}
    assert forged and forged <= rejected, forged - rejected
    assert not forged & {e.command_id for e in run.of(r.CommandApplied)}
