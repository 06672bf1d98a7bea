"""The decider service: its pure core behind the shared faust shell (`tailguard services up`)."""

from tailguard.decider.policy import ParallelismDecider
from tailguard.model.records import EVENTS_TOPIC
from tailguard.shell import core_metrics as m
from tailguard.shell.definition import ServiceDefinition
from tailguard.shell.retention import UntilJobFinished

DEFINITION = ServiceDefinition(
    name="decider",
    input_topic=EVENTS_TOPIC,
    # The core deletes a job at its JobFinished: a snapshot keeps only unfinished jobs' input.
    retention=UntilJobFinished,
    core=ParallelismDecider,
    metrics=(
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
        m.same_as_emitted("decisions_emitted", "SetParallelism"),
    ),
)
