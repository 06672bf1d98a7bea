"""The blocklist service: its pure core behind the shared faust shell (`tailguard services up`).

The core is the fleet blocklist (`fleet.py`), which wraps the per-job `BlocklistTracker`: each
job's commands as before, plus one view of slow hosts across jobs, published on the compacted
topic `tailguard.blocklist` (`tailguard.log.fleet_topic`).
"""

from tailguard.blocklist.fleet import FleetBlocklist
from tailguard.log import fleet_topic
from tailguard.model.fleet import FleetBlock
from tailguard.model.records import FINDINGS_TOPIC
from tailguard.shell import core_metrics as m
from tailguard.shell.definition import ServiceDefinition
from tailguard.shell.retention import CoreState

DEFINITION = ServiceDefinition(
    name="blocklist",
    input_topic=FINDINGS_TOPIC,
    core=FleetBlocklist.publishing,
    # Its snapshot is the core's state, which the core keeps bounded (CoreState says why not
    # the input it depends on).
    retention=CoreState,
    encoders={FleetBlock: lambda entry: fleet_topic.encode(_entry(entry))},
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
    ),
)


def _entry(record: object) -> FleetBlock:
    assert isinstance(record, FleetBlock)
    return record
