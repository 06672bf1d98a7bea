"""The speculator service: its pure core behind the shared faust shell (`tailguard services up`)."""

from tailguard.model.records import FINDINGS_TOPIC
from tailguard.shell import core_metrics as m
from tailguard.shell.definition import ServiceDefinition
from tailguard.shell.retention import RecentJobs
from tailguard.speculator.policy import MAX_TRACKED_JOBS, SpeculationStrategy

DEFINITION = ServiceDefinition(
    name="speculator",
    input_topic=FINDINGS_TOPIC,
    core=SpeculationStrategy,
    # The core keeps its MAX_TRACKED_JOBS most recently active jobs: so does its snapshot.
    retention=lambda: RecentJobs(MAX_TRACKED_JOBS),
    metrics=(
        m.jobs_tracked("jobs"),
        m.slow_execution_vertices("numSlowExecutionVertices"),
        m.effective_speculative_executions("numEffectiveSpeculativeExecutions"),
        m.counter(
            "speculativeAttemptsLaunched",
            "tailguard_speculator_attempts_requested_total",
            "speculative attempts asked for (a LaunchSpeculativeAttempts asks for one or more)",
        ),
    ),
)
