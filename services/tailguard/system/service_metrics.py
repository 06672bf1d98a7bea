"""How each service's core counts are exported: per key of its `metrics()`, a Prometheus name, a
type and a help line (the rules and the shared names are in `core_metrics`). The table of the
services (`tailguard.system.services`) names each service's tuple; a test checks that every key a
core counts is listed, and docs/operations.md lists them all.
"""

from __future__ import annotations

from tailguard.system import core_metrics as m
from tailguard.system.core_metrics import CoreMetric

DETECTOR: tuple[CoreMetric, ...] = (
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
)

SPECULATOR: tuple[CoreMetric, ...] = (
    m.jobs_tracked("jobs"),
    m.slow_execution_vertices("numSlowExecutionVertices"),
    m.effective_speculative_executions("numEffectiveSpeculativeExecutions"),
    m.counter(
        "speculativeAttemptsLaunched",
        "tailguard_speculator_attempts_requested_total",
        "speculative attempts asked for (a LaunchSpeculativeAttempts asks for one or more)",
    ),
)

BLOCKLIST: tuple[CoreMetric, ...] = (
    m.gauge(
        "blockedHosts",
        "tailguard_blocklist_blocked_hosts",
        "hosts blocked now, summed over the jobs tracked",
    ),
    m.counter(
        "hostsBlocked",
        "tailguard_blocklist_host_blocks_total",
        "hosts newly blocked (an extension of a block is not counted)",
    ),
    m.counter(
        "hostsSkippedByFraction",
        "tailguard_blocklist_blocks_refused_total",
        "blocks not issued because blocklist.max-blocked-fraction was reached",
    ),
    m.counter(
        "earlyUnblocks",
        "tailguard_blocklist_early_unblocks_total",
        "hosts unblocked before their time: no fresh slow attempt there within the window",
    ),
    m.counter(
        "slowAttemptsBlamedOnTheTask",
        "tailguard_blocklist_slow_attempts_blamed_on_task_total",
        "slow attempts not counted against their host: their subtask was slow on 2+ hosts",
    ),
    m.gauge(
        "fleetBlockedHosts",
        "tailguard_blocklist_fleet_blocked_hosts",
        "hosts on the fleet list now (tailguard.blocklist)",
    ),
    m.counter(
        "fleetBlocks",
        "tailguard_blocklist_fleet_blocks_total",
        "hosts newly put on the fleet list (an extension is not counted)",
    ),
    m.counter(
        "fleetBlocksSentToJobs",
        "tailguard_blocklist_fleet_job_blocks_total",
        "BlockNodes sent to jobs for fleet blocks they did not hold yet",
    ),
    m.counter(
        "fleetBlocksRefusedByJobCap",
        "tailguard_blocklist_fleet_job_blocks_refused_total",
        "fleet blocks not sent to a job: over that job's blocklist.max-blocked-fraction",
    ),
    m.same_as_emitted("blocksIssued", "BlockNodes"),
    m.same_as_emitted("unblocksIssued", "UnblockNodes"),
)

DECIDER: tuple[CoreMetric, ...] = (
    m.jobs_tracked("jobs_active"),
    m.config_errors("config_errors"),
    m.counter(
        "vertices_decided",
        "tailguard_decider_vertices_decided_total",
        "non-source vertices given a parallelism and subpartition ranges",
    ),
    m.counter(
        "sources_decided",
        "tailguard_decider_sources_decided_total",
        "sources given a parallelism from their splits",
    ),
    m.counter(
        "sources_without_splits",
        "tailguard_decider_sources_without_splits_total",
        "sources with no split to hand out, left to the agent",
    ),
    m.counter(
        "forward_group_followers",
        "tailguard_decider_forward_group_followers_total",
        "vertices that took their forward group's parallelism",
    ),
    m.counter(
        "forward_group_breaks",
        "tailguard_decider_forward_group_breaks_total",
        "forward groups whose members could not share one parallelism",
    ),
    m.counter(
        "broadcast_capped",
        "tailguard_decider_broadcast_capped_total",
        "decisions where broadcast bytes were capped (max-broadcast-ratio)",
    ),
    m.counter(
        "fixed_beyond_data",
        "tailguard_decider_fixed_beyond_data_total",
        "fixed parallelisms larger than their inputs can feed",
    ),
    m.counter(
        "broadcast_joins",
        "tailguard_decider_broadcast_joins_total",
        "joins turned into broadcast joins (a side produced under the broadcast threshold)",
    ),
    m.counter(
        "skewed_joins_split",
        "tailguard_decider_skewed_joins_split_total",
        "joins decided with skewed subpartitions split across subtasks",
    ),
    m.same_as_emitted("decisions_emitted", "SetParallelism"),
)

FAILOVER: tuple[CoreMetric, ...] = (
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
)
