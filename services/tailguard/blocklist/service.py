"""The blocklist service: its pure core behind the shared faust shell (`tailguard services up`)."""

from tailguard.blocklist.policy import BlocklistTracker
from tailguard.model.records import FINDINGS_TOPIC
from tailguard.shell import core_metrics as m
from tailguard.shell.definition import ServiceDefinition

DEFINITION = ServiceDefinition(
    name="blocklist",
    input_topic=FINDINGS_TOPIC,
    core=BlocklistTracker,
    metrics=(
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
        m.same_as_emitted("blocksIssued", "BlockNodes"),
        m.same_as_emitted("unblocksIssued", "UnblockNodes"),
    ),
)
