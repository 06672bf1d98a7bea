"""`explain`: the causal chain on the recorded demo, lookups, settings read, and the command."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from tests.examples_budget import examples
from tests.strategies import records
from tests.unit.inspect_records import (
    DEMO_ARCHIVE,
    DEMO_FINDING,
    DEMO_HEAD,
    DEMO_LAUNCH,
    DEMO_TICK,
    JobLog,
)

from tailguard.cli import main
from tailguard.inspect import describe as describe_module
from tailguard.inspect.explain import Step, UnknownId, explain, find, render_text
from tailguard.inspect.history import History, history_of
from tailguard.inspect.reading import archived
from tailguard.inspect.settings_used import JOB, SERVICE, settings_used
from tailguard.model import records as r
from tailguard.model.config import Settings


@pytest.fixture(scope="module")
def demo() -> History:
    return history_of(archived(str(DEMO_ARCHIVE), Settings()))


def child(step: Step, record_type: type[r.Record], via: str = "") -> Step:
    return next(
        s for s in step.steps if isinstance(s.record, record_type) and s.via.startswith(via)
    )


def test_speculative_launch_down_to_the_slow_attempt_and_the_tick(demo: History) -> None:
    explanation = explain(demo, find(demo, DEMO_LAUNCH))
    root = explanation.root
    assert isinstance(root.record, r.LaunchSpeculativeAttempts)
    assert root.direction == "received"
    finding = child(root, r.SlowTasksDetected, "caused by")
    assert finding.record_id == DEMO_FINDING
    tick = child(finding, r.Tick, "caused by")
    assert tick.record_id == DEMO_TICK
    slow = f"slow attempt {DEMO_HEAD}#2.0"
    deploying = child(finding, r.AttemptDeploying, slow)
    assert isinstance(deploying.record, r.AttemptDeploying)
    assert (deploying.record.host, deploying.record.attempt) == ("127.0.0.4", 0)
    progress = child(finding, r.AttemptProgress, slow)
    assert progress.record is not None and progress.record.ts <= finding.record.ts
    # The deployment was shown already: the progress' own link to it says so.
    assert child(progress, r.AttemptDeploying).repeated
    # And below the slow attempt, what started it: its vertex, initialised by the decider.
    initialized = child(deploying, r.VertexInitialized, "started by")
    assert child(initialized, r.SetParallelism, "on command").direction == "received"


def test_what_followed_the_launch(demo: History) -> None:
    effects = explain(demo, find(demo, DEMO_LAUNCH)).effects
    applied = next(e for e in effects if isinstance(e.record, r.CommandApplied))
    copy = next(e for e in effects if isinstance(e.record, r.AttemptDeploying))
    assert applied.record.command_id == DEMO_LAUNCH
    assert copy.record.speculative and copy.record.attempt == 1
    (ended,) = copy.steps
    assert isinstance(ended.record, r.AttemptFinished) and ended.record.attempt == 1


def test_settings_of_each_decider_in_the_chain(demo: History) -> None:
    explanation = explain(demo, find(demo, DEMO_LAUNCH))
    by_service = {s.service: {u.key: u for u in s.settings} for s in explanation.settings}
    assert list(by_service) == ["speculator", "detector", "decider"]
    limit = by_service["speculator"]["execution.batch.speculative.max-concurrent-executions"]
    assert (limit.value, limit.source, limit.scope) == ("2", "default", SERVICE)
    bound = by_service["detector"]["slow-task-detector.execution-time.baseline-lower-bound"]
    assert (bound.value, bound.source, bound.scope) == ("1500 ms", "job config", JOB)
    # The detector does not read the check interval (the agent's Ticks carry it).
    assert "slow-task-detector.check-interval" not in by_service["detector"]


def test_text_reads_command_then_finding_then_its_causes(demo: History) -> None:
    text = render_text(explain(demo, find(demo, DEMO_LAUNCH)))
    order = [
        f"LaunchSpeculativeAttempts {DEMO_LAUNCH}",
        f"← caused by: SlowTasksDetected {DEMO_FINDING}",
        f"← caused by: Tick {DEMO_TICK}",
        f"← slow attempt {DEMO_HEAD}#2.0: AttemptDeploying",
        "what followed:",
        f"{DEMO_HEAD}#2.1 deployed on 127.0.0.2, speculative",
        "settings the speculator read",
        "execution.batch.speculative.max-concurrent-executions = 2  (default)",
        "settings the detector read",
    ]
    positions = [text.index(part) for part in order]
    assert positions == sorted(positions), text


def test_find_by_id_prefix_and_attempt_name(demo: History) -> None:
    assert find(demo, DEMO_LAUNCH).id == DEMO_LAUNCH
    assert find(demo, "speculator-5c0e").id == DEMO_LAUNCH
    copy = find(demo, f"{DEMO_HEAD}#2.1")
    assert isinstance(copy, r.AttemptDeploying) and copy.speculative
    with pytest.raises(UnknownId, match="is the start of 18 ids"):
        find(demo, "detector-")
    with pytest.raises(UnknownId, match=f"did you mean {DEMO_LAUNCH}"):
        find(demo, DEMO_LAUNCH.replace("5c0e", "5c0f"))
    with pytest.raises(UnknownId, match="no record 'zzz'") as raised:
        find(demo, "zzz")
    assert "did you mean" not in str(raised.value)


def test_links_the_records_imply() -> None:
    log = JobLog()
    log.submitted()
    log.initialized(1, "src", 1)
    log.deploy(2, "src", 0, 0, "h1")
    log.deploy(3, "src", 0, 1, "h2", speculative=True, command_id="test-1")
    won = log.finish(5, "src", 0, 1, "h2")
    lost = log.attempt(r.AttemptCanceled, 5, "src", 0, 0, "h1", reason=r.CancelReason.LOST_RACE)
    log.deploy(6, "sink", 0, 0, "h1")
    failed = log.attempt(
        r.AttemptFailed,
        7,
        "sink",
        0,
        0,
        "h1",
        error=r.ErrorKind.PARTITION_MISSING,
        message="gone",
        missing_partition=r.PartitionRef("src", 0, 1),
    )
    history = history_of(log.records)
    lost_step = explain(history, lost).root
    assert child(lost_step, r.AttemptFinished, "lost to").record_id == won.id
    failed_step = explain(history, failed).root
    assert child(failed_step, r.AttemptFinished, "missing partition").record_id == won.id
    # The copy names a command the archive does not hold (e.g. a test posted it).
    copy = explain(history, find(history, "src#0.1")).root
    (missing,) = copy.steps
    assert (missing.record, missing.record_id, missing.via) == (None, "test-1", "started by")
    assert "started by: test-1 (not in this archive)" in render_text(explain(history, copy.record))


def test_settings_read_per_job_or_at_service_start() -> None:
    log = JobLog()
    log.submitted({"blocklist.min-slow-attempts": "1"})
    history = history_of(log.records)
    # The blocklist reads its rule once when built; the decider reads the job's config.
    blocklist = {u.key: u for u in settings_used("blocklist", history).settings}
    assert blocklist["blocklist.min-slow-attempts"].scope == SERVICE
    assert blocklist["blocklist.min-slow-attempts"].value == "1"
    assert blocklist["blocklist.evidence-window"].source == "default"
    log.initialized(1, "src", 1)
    decider = settings_used("decider", history_of(log.records))
    assert {u.scope for u in decider.settings} == {JOB}
    with pytest.raises(ValueError, match="no decision core named 'agent'"):
        settings_used("agent", history)


def test_command_prints_the_chain_and_refuses_clearly(
    capsys: pytest.CaptureFixture[str], tmp_path: object
) -> None:
    assert main(["explain", str(DEMO_ARCHIVE), "speculator-5c0e"]) == 0
    out = capsys.readouterr().out
    assert f"LaunchSpeculativeAttempts {DEMO_LAUNCH}" in out and "← caused by: Tick" in out
    assert main(["explain", str(DEMO_ARCHIVE), "speculator-5c0f"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tailguard explain: no record 'speculator-5c0f'")
    assert main(["explain", str(DEMO_ARCHIVE.with_name("none.avro")), "x"]) == 2
    assert "no archive at" in capsys.readouterr().err
    assert main(["explain", __file__, "x"]) == 2
    assert "not an Avro object container file" in capsys.readouterr().err


def test_every_record_type_is_described() -> None:
    assert set(describe_module._DESCRIBE) == set(r.RECORD_TYPES)


@given(records())
@settings(max_examples=examples(200), deadline=None)
def test_any_record_can_be_described(record: r.Record) -> None:
    assert describe_module.describe(record, 0)
