"""Observe mode's pure parts: Spark's listener lines to tailguard events (and the detector finding a
straggler in them, unchanged), and the fleet list's export forms."""

from __future__ import annotations

import pytest

from tailguard.blocklist.export import ExportError, host_list, k8s, yarn
from tailguard.detector.policy import SlowTaskDetector
from tailguard.model import records as r
from tailguard.model.config import Settings
from tailguard.observer.translate import ObserveError, SparkEventTranslator

APP = "app-1"
POLICY = {
    "slow-task-detector.execution-time.baseline-lower-bound": "1 s",
    "slow-task-detector.check-interval": "250 ms",
}


def lines(text: str) -> list[list[str]]:
    return [line.strip().split("|") for line in text.strip().splitlines() if line.strip()]


def translate(text: str, translator: SparkEventTranslator | None = None) -> list[r.Event]:
    t = translator or SparkEventTranslator(POLICY)
    return [e for fields in lines(text) for e in t.handle(fields)]


# A Spark job of two stages (scan, then the shuffle's reduce) on hosts a and b; task 3 of the
# scan starts on b at 1000 and is still running at 2500, when its three siblings on a are done.
HISTORY = """
A|0|app-1|sales
X|10|1|a|2
X|11|2|b|2
X|12|driver|d|1
J|100|0|2
G|0|0|4||parquet at job.py:3
G|0|1|2|0|collect at job.py:5
TS|1000|10|0|0|0|0|0|1|a|0
TS|1000|11|0|0|1|1|0|1|a|0
TS|1000|12|0|0|2|2|0|1|a|0
TS|1000|13|0|0|3|3|0|2|b|0
TE|1200|10|0|0|Success|100|10|-1|-1|
TE|1210|11|0|0|Success|100|10|-1|-1|
TE|1220|12|0|0|Success|100|10|-1|-1|
"""


def test_a_spark_job_becomes_a_tailguard_job_with_stages_as_vertices() -> None:
    events = translate(HISTORY)
    submitted = events[0]
    assert isinstance(submitted, r.JobSubmitted)
    assert submitted.job_id == "app-1-job-0"
    assert submitted.config == POLICY
    spec = submitted.graph
    assert [(v.name, v.kind, v.parallelism) for v in spec.vertices] == [
        ("stage-0", r.VertexKind.SOURCE, 4),
        ("stage-1", r.VertexKind.OPERATOR, 2),
    ]
    assert spec.edges == (r.EdgeSpec("stage-0", "stage-1", r.Distribution.ALL_TO_ALL),)
    # The driver is no node: no task runs there outside local mode.
    assert [e.host for e in events if isinstance(e, r.NodeAdded)] == ["a", "b"]
    initialised = [e for e in events if isinstance(e, r.VertexInitialized)]
    assert [(e.vertex, e.parallelism, e.decided_by) for e in initialised] == [
        ("stage-0", 4, "spark"),
        ("stage-1", 2, "spark"),
    ]
    deploying = [e for e in events if isinstance(e, r.AttemptDeploying)]
    assert [(e.subtask, e.attempt, e.host) for e in deploying] == [
        (0, 0, "a"),
        (1, 0, "a"),
        (2, 0, "a"),
        (3, 0, "b"),
    ]
    finished = [e for e in events if isinstance(e, r.AttemptFinished)]
    assert [(e.subtask, e.input_bytes, e.records, e.ts) for e in finished] == [
        (0, 100, 10, 1200),
        (1, 100, 10, 1210),
        (2, 100, 10, 1220),
    ]
    # Ids are the job's sequence: unique, and the same for the same lines.
    assert len({e.id for e in events}) == len(events)
    assert [e.id for e in translate(HISTORY)] == [e.id for e in events]


def test_the_detector_finds_the_straggler_on_the_slow_host_unchanged() -> None:
    translator = SparkEventTranslator(POLICY)
    detector = SlowTaskDetector(Settings())
    findings: list[r.Record] = []
    for event in translate(HISTORY, translator) + translator.tick(2500):
        findings += detector.handle(event)
    [finding] = [f for f in findings if isinstance(f, r.SlowTasksDetected)]
    assert finding.vertex == "stage-0"
    [slow] = finding.slow
    assert slow.subtask == 3
    assert [(a.host, a.execution_time_ms, a.slow) for a in slow.live_attempts] == [
        ("b", 1500, True)
    ]
    assert finding.hosts == ("a", "b")


def test_speculative_copies_retries_and_kills_keep_their_attempt_numbers() -> None:
    events = translate(
        HISTORY
        + """
TS|2000|14|0|0|3|3|1|1|a|1
TE|2100|14|0|0|Success|100|10|-1|-1|
TE|2110|13|0|0|TaskKilled|-1|-1|-1|-1|TaskKilled(another attempt succeeded)
TS|2200|15|1|0|0|0|0|2|b|0
TE|2300|15|1|0|ExceptionFailure|-1|-1|-1|-1|boom
TS|2400|16|1|0|0|0|1|1|a|0
TE|2500|16|1|0|Success|-1|-1|50|5|
JE|2600|0|SUCCEEDED
"""
    )
    copy = [e for e in events if isinstance(e, r.AttemptDeploying) and e.speculative]
    assert [(e.subtask, e.attempt, e.host) for e in copy] == [(3, 1, "a")]
    [cancel] = [e for e in events if isinstance(e, r.AttemptCanceled)]
    assert (cancel.subtask, cancel.attempt, cancel.reason) == (3, 0, r.CancelReason.LOST_RACE)
    [failed] = [e for e in events if isinstance(e, r.AttemptFailed)]
    assert (failed.vertex, failed.attempt, failed.error, failed.message) == (
        "stage-1",
        0,
        r.ErrorKind.USER,
        "boom",
    )
    reduce_done = [e for e in events if isinstance(e, r.AttemptFinished) and e.vertex == "stage-1"]
    assert [(e.attempt, e.input_bytes, e.records) for e in reduce_done] == [(1, 50, 5)]
    assert isinstance(events[-1], r.JobFinished) and events[-1].status is r.JobStatus.SUCCEEDED


def test_a_heartbeat_reports_a_running_tasks_reads_as_progress() -> None:
    events = translate(
        HISTORY
        + """
TP|1500|13|40|4|-1|-1
TP|1500|99|40|4|-1|-1
TE|2110|13|0|0|Success|100|10|-1|-1|
TP|2200|13|100|10|-1|-1
"""
    )
    progress = [e for e in events if isinstance(e, r.AttemptProgress)]
    # Task 99 never started under observation; task 13 had ended by the last heartbeat.
    assert [(e.vertex, e.subtask, e.attempt, e.host, e.bytes_read, e.records_read) for e in
            progress] == [("stage-0", 3, 0, "b", 40, 4)]  # fmt: skip
    assert progress[0].bytes_total is None and progress[0].ts == 1500


def test_a_copy_still_running_at_the_jobs_end_lost_the_race() -> None:
    # Spark posts the job's end, then kills the attempts it no longer needs.
    events = translate(
        HISTORY
        + """
TS|2000|14|0|0|3|3|1|1|a|1
TE|2100|14|0|0|Success|100|10|-1|-1|
TS|2200|15|1|0|0|0|0|2|b|0
TS|2200|16|1|0|1|1|0|1|a|0
TE|2300|15|1|0|Success|-1|-1|50|5|
TE|2300|16|1|0|Success|-1|-1|50|5|
JE|2600|0|SUCCEEDED
TE|2610|13|0|0|TaskKilled|-1|-1|-1|-1|TaskKilled(another attempt succeeded)
"""
    )
    ends = [e for e in events if isinstance(e, r.AttemptCanceled | r.JobFinished)]
    assert [(type(e).__name__, getattr(e, "subtask", None), getattr(e, "reason", None))
            for e in ends] == [("AttemptCanceled", 3, r.CancelReason.LOST_RACE),
                               ("JobFinished", None, None)]  # fmt: skip


def test_ticks_go_to_running_jobs_only_and_never_back_in_time() -> None:
    translator = SparkEventTranslator()
    translate(HISTORY, translator)
    assert [e.ts for e in translator.tick(3000)] == [3000]
    assert [e.ts for e in translator.tick(2000)] == [3000]
    translate("JE|3100|0|FAILED", translator)
    assert translator.tick(4000) == []


def test_a_task_of_a_job_started_before_the_listener_is_ignored() -> None:
    translator = SparkEventTranslator()
    assert (
        translate("A|0|app-1|x\nTS|5|1|7|0|0|0|0|1|a|0\nTE|6|1|7|0|Success|1|1|-1|-1|", translator)
        == []
    )
    assert translator.ignored == 2


def test_the_application_end_closes_the_jobs_still_open() -> None:
    events = translate(HISTORY + "E|9000")
    assert isinstance(events[-1], r.JobFinished)
    assert events[-1].status is r.JobStatus.CANCELED


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("Q|1", "unknown line type 'Q'"),
        ("J|1|0|1", "a job before the application line"),
        ("A|0|app|x\nTS|x|1|0|0|0|0|0|1|a|0", "malformed TS line"),
        ("A|0|app|x\nG|0|0|4||s", "not being declared"),
    ],
)
def test_a_bad_line_is_an_error_naming_it(text: str, problem: str) -> None:
    with pytest.raises(ObserveError, match=problem):
        translate(text, SparkEventTranslator())


def test_the_fleet_list_exports_for_yarn_kubernetes_and_as_hosts() -> None:
    hosts = ["10.0.0.7", "node-3.example", "10.0.0.7"]
    assert yarn(hosts) == "spark.yarn.exclude.nodes=10.0.0.7,node-3.example\n"
    assert host_list(hosts) == "10.0.0.7\nnode-3.example\n"
    template = k8s(hosts)
    assert "operator: NotIn" in template and "key: kubernetes.io/hostname" in template
    assert template.endswith('                - "10.0.0.7"\n                - "node-3.example"\n')
    # Kubernetes refuses NotIn with no values: an empty list is a template without affinity.
    assert "affinity" not in k8s([])
    assert yarn([]) == "spark.yarn.exclude.nodes=\n"


def test_a_host_the_format_cannot_carry_is_refused_by_name() -> None:
    with pytest.raises(ExportError, match="'a,b'"):
        yarn(["a,b"])


def test_tailguard_observe_is_the_function_even_once_its_package_is_imported() -> None:
    """The package is `tailguard.observer`: a subpackage named `observe` would replace the
    function `tailguard.observe` the moment anything imported it."""
    import tailguard
    import tailguard.observer

    assert callable(tailguard.observe)
    assert tailguard.observe is tailguard.observer.observe
