"""The failover service: its pure core behind the shared faust shell (`tailguard services up`)."""

from tailguard.failover.policy import FailoverStrategy
from tailguard.model.records import EVENTS_TOPIC
from tailguard.shell import core_metrics as m
from tailguard.shell.definition import ServiceDefinition
from tailguard.shell.retention import UntilJobFinished

DEFINITION = ServiceDefinition(
    name="failover",
    input_topic=EVENTS_TOPIC,
    # The core deletes a job at its JobFinished: a snapshot keeps only unfinished jobs' input.
    retention=UntilJobFinished,
    core=FailoverStrategy,
    metrics=(
        m.jobs_tracked("jobs"),
        m.config_errors("config_errors"),
        m.counter(
            "failovers",
            "tailguard_failover_failovers_total",
            "failures answered by a restart decision (or by failing the job at the limit)",
        ),
        m.counter(
            "restarted_tasks",
            "tailguard_failover_restarted_tasks_total",
            "subtasks named in RestartTasks commands",
        ),
        m.counter(
            "ignored_failures",
            "tailguard_failover_ignored_failures_total",
            "failures needing no restart (a retired or cancelled attempt, a finished subtask)",
        ),
        m.counter(
            "non_recoverable_failures",
            "tailguard_failover_non_recoverable_failures_total",
            "failures that recur wherever they run: the job fails without a restart",
        ),
        m.counter(
            "jobs_failed",
            "tailguard_failover_jobs_failed_total",
            "jobs failed with FailJob (restart limit reached or a non-recoverable failure)",
        ),
        m.counter(
            "deferred_checks",
            "tailguard_failover_deferred_checks_total",
            "consumers kept running while a partition they read is re-produced",
        ),
        m.counter(
            "deferred_matched",
            "tailguard_failover_deferred_matched_total",
            "re-produced partitions whose checksums matched: their consumers were spared",
        ),
        m.counter(
            "deferred_restarts",
            "tailguard_failover_deferred_restarts_total",
            "consumer restarts because a re-produced partition differed",
        ),
    ),
)
