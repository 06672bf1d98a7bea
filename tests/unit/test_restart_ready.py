"""The restart benchmark's pure parts (benchmarks/restart_ready.py): which live event it times,
and a summary that says when a restart never decided. The benchmark itself is `make
bench-restart` (minutes: real service processes, kill -9).

The benchmark is not a package: its directory goes on sys.path, as when it runs as a script.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

from load import as_job, recorded_job  # noqa: E402
from restart_ready import (  # noqa: E402
    BenchError,
    Restart,
    first_decision_after_half,
    main,
    summary,
)
from tailguard.codec import codec_for  # noqa: E402
from tailguard.model import records as r  # noqa: E402
from tailguard.model.config import Settings  # noqa: E402
from tailguard.shell.processor import Processor  # noqa: E402
from tailguard.system.services import service_named  # noqa: E402


@pytest.fixture(scope="module")
def template() -> list[r.Event]:
    return recorded_job(200, 1)


@pytest.mark.parametrize("service", ["decider", "detector"])
def test_the_timed_event_is_the_first_decision_past_halfway(
    template: list[r.Event], service: str
) -> None:
    settings = Settings()
    definition = service_named(service)
    cut = first_decision_after_half(definition, settings, template)
    assert cut >= len(template) // 2
    # A live job fed up to the cut, then the cut's event: only that event decides.
    codec = codec_for(settings)
    core = Processor(definition, settings, codec)
    job = as_job(template, "live-0")
    decided_at = [i for i, e in enumerate(job[: cut + 1]) if core.process(codec.encode(e), 0, i)]
    assert decided_at[-1] == cut
    assert all(i < len(job) // 2 for i in decided_at[:-1])


def test_a_service_that_decides_nothing_is_refused_by_name(template: list[r.Event]) -> None:
    # The recorded job has no failure: failover has nothing to answer.
    with pytest.raises(BenchError, match="failover decides nothing"):
        first_decision_after_half(service_named("failover"), Settings(), template)


def test_summary_says_a_restart_without_a_decision() -> None:
    runs = [
        Restart(True, 7.5, 7.6, 40_000, 2_000, 10, 0.5, 6.1, 3.0),
        Restart(True, 8.5, None, 40_000, 2_000, 1, 0.4, 6.3, 3.0),
    ]
    text = "\n".join(summary("with the snapshot:", runs))
    assert "median 8.00 s, 7.50-8.50 over 2" in text
    assert "NO DECISION within the timeout in 1 restart(s)" in text
    assert "2,000, 2,000 records" in text


def test_too_few_live_jobs_for_the_restarts_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--live", "3", "--restarts", "2"])
    assert "at least 2 x --restarts = 4" in capsys.readouterr().err
