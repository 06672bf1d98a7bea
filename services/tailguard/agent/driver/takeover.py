"""Recovery takeover: the new driver rebuilds the dead one's state from its log, checks what it
finished, and records what was lost with it (the rules are `recovery.py`'s)."""

from __future__ import annotations

import logging

from tailguard.agent.driver import recovery
from tailguard.agent.driver.applier import CommandApplier
from tailguard.agent.driver.context import JobContext
from tailguard.model import records as r

log = logging.getLogger("tailguard.agent")


def take_over(
    ctx: JobContext, job_log: recovery.JobLog, spec: r.JobGraphSpec, applier: CommandApplier
) -> recovery.Recovered:
    """Take the job over from `job_log`; the sinks keep their committed parts (no
    `prepare_sink`). `RecoveryError` before anything is recorded when it cannot be."""
    rebuilt = recovery.rebuild(ctx.state, job_log)
    if rebuilt.submitted.graph != spec:
        raise recovery.RecoveryError(
            f"job {ctx.job_id}: the job given is not the one its log recorded (the graph "
            "or its input splits differ): recover it with the same job file, parameters "
            "and input"
        )
    recovery.reconcile(ctx.state, rebuilt, ctx.storage, ctx.job_id)
    ctx.events.sequence = rebuilt.last_sequence
    # Handled ids stay handled; the local cores see the job's history as the services did,
    # so a decision pending at the crash is still taken (under the id the service gives it).
    applier.intake.restore(rebuilt.handled)
    for command_id in rebuilt.handled:
        applier.fallbacks.settle(command_id)
    for event in rebuilt.events:
        applier.fallbacks.observe(event)
    log.info(
        "job %s recovered from %s: %d result(s) kept, %d attempt(s) lost with the driver, "
        "%d result(s) lost (%d to produce again)",
        ctx.job_id,
        job_log.source,
        rebuilt.kept_results,
        len(rebuilt.lost_attempts),
        len(rebuilt.lost_results),
        len(rebuilt.rerun_partitions),
    )
    # Before anything else: the log says where this driver took over, and with what.
    ctx.events.emit(r.JobRecovered, **rebuilt.marker(job_log.source))
    # The services still time the lost attempts as running: end them for everyone.
    for attempt in rebuilt.lost_attempts:
        ctx.events.attempt_event(r.AttemptCanceled, attempt, reason=r.CancelReason.RESTART)
    for lost in rebuilt.lost_results:
        if ctx.state.vertices[lost.partition.vertex].definition.sink is None:
            ctx.events.emit(r.PartitionReleased, partition=lost.partition)
    return rebuilt
