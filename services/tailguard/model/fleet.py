"""The cluster-wide (fleet) blocklist's records: one entry per blocked host.

The blocklist service keeps one view of slow hosts across every job and publishes it on the
compacted topic `tailguard.blocklist`, keyed by host: the latest value of a key is the host's
current block, and a tombstone (no value) says the host is no longer blocked. A job that starts
reads the topic to its end and applies what is still in force; anyone can read the current list.

The module is pure: standard library and records only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from tailguard.model.records import Record

BLOCKLIST_TOPIC = "tailguard.blocklist"
# Its topic settings for a real Kafka cluster (`kafka-topics --create --config ...`): keep the
# last value per host, and drop tombstones a day after they were written (`kafka/topics.py`).
BLOCKLIST_TOPIC_CONFIG = {"cleanup.policy": "compact", "delete.retention.ms": "86400000"}

# BlockNodes the fleet sends to a job, and NodeBlocked a job records for a fleet entry, have a
# cause that starts with this: a reader of one job's archive tells a block the job earned from
# one it inherited, and the agent knows which blocks a job that opted out does not take.
FLEET_CAUSE_PREFIX = "fleet: "

# The setting by which a job opts out of the fleet list (it keeps its own, per-job blocks).
FLEET_SETTING = "blocklist.fleet"


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetBlock(Record):
    """A host's entry in the fleet list, as the service decided it at `ts`.

    `until_ts` None removes the entry (published as a tombstone). `job_id` is the job whose
    finding caused the change (an operator's entry: `operator`), `evidence` the ids of the
    findings (or the operator command) behind the block: the cause a job records when it
    applies it.
    """

    TOPIC: ClassVar[str] = BLOCKLIST_TOPIC
    host: str
    until_ts: int | None
    cause: str = ""
    evidence: tuple[str, ...] = ()

    @property
    def removed(self) -> bool:
        return self.until_ts is None

    def fleet_cause(self) -> str:
        """The cause a job records when it takes this block: what and on whose evidence."""
        return f"{FLEET_CAUSE_PREFIX}{self.cause} (evidence {', '.join(self.evidence) or '-'})"


def is_fleet_cause(cause: str) -> bool:
    """Whether a block's cause says the fleet list sent it (not the job's own evidence)."""
    return cause.startswith(FLEET_CAUSE_PREFIX)


def current_entries(changes: list[FleetBlock], now: int) -> dict[str, FleetBlock]:
    """host -> its block still in force at `now`, from the topic's changes in their order (what
    compaction keeps: the last value per key, a tombstone deleting it)."""
    latest: dict[str, FleetBlock] = {}
    for change in changes:
        if change.removed:
            latest.pop(change.host, None)
        else:
            latest[change.host] = change
    return {h: e for h, e in latest.items() if e.until_ts is not None and e.until_ts > now}
