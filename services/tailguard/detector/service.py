"""The detector service: its pure core behind the shared faust shell (`tailguard services up`)."""

from tailguard.detector.policy import SlowTaskDetector
from tailguard.model.records import EVENTS_TOPIC
from tailguard.shell import core_metrics as m
from tailguard.shell.definition import ServiceDefinition
from tailguard.shell.retention import UntilJobFinished

DEFINITION = ServiceDefinition(
    name="detector",
    input_topic=EVENTS_TOPIC,
    # The core deletes a job at its JobFinished: a snapshot keeps only unfinished jobs' input.
    retention=UntilJobFinished,
    core=SlowTaskDetector,
    metrics=(
        m.jobs_tracked("jobs"),
        m.config_errors("config_errors"),
        m.slow_execution_vertices("slow_vertices"),
        m.effective_speculative_executions("speculative_wins"),
        m.counter(
            "attempts_examined",
            "tailguard_detector_attempts_examined_total",
            "live attempts walked by the Tick checks (what a Tick's cost is proportional to)",
        ),
        m.same_as_emitted("findings_emitted", "SlowTasksDetected|SpeculativeAttemptWon"),
    ),
)
