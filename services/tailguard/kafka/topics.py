"""tailguard's topics as a Kafka cluster must hold them: partitions and topic settings.

The embedded Kafka broker creates these at every start (those that exist are left as they are);
for an existing cluster, `kafka-topics.sh --create` them with the same settings
(docs/log.md#production-an-existing-kafka-cluster). A topic not declared here (a test's own
topic) is created on its first produce with the broker's default of 4 partitions.

- The three record topics keep a week: a service rebuilds a running job's state from them at
  start (`shell/rebuild.py`), so retention must outlast the longest job; the archive is the
  durable record of a finished job.
- The dead-letter and unauthenticated topics are read by people after an incident: a month.
- `tailguard.blocklist` is a table (the last value per host): compacted, a tombstone kept a day
  so every reader folds it before it goes (`blocklist/fleet_topic.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tailguard.kafka.dead_letters import dlq_topic
from tailguard.model.authority import (
    UNAUTHENTICATED_COMMANDS_TOPIC,
    UNAUTHENTICATED_FINDINGS_TOPIC,
)
from tailguard.model.fleet import BLOCKLIST_TOPIC, BLOCKLIST_TOPIC_CONFIG
from tailguard.model.records import COMMANDS_TOPIC, EVENTS_TOPIC, FINDINGS_TOPIC

# Records of one job share a key, so a partition count only spreads jobs: 4 is what topics
# created on first produce get too (the broker's `num.partitions`).
PARTITIONS = 4
_DAY_MS = 24 * 3600 * 1000
RECORDS_RETENTION_MS = 7 * _DAY_MS
AUDIT_RETENTION_MS = 30 * _DAY_MS


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int = PARTITIONS
    config: dict[str, str] = field(default_factory=dict)


def _deleted_after(ms: int) -> dict[str, str]:
    return {"cleanup.policy": "delete", "retention.ms": str(ms)}


def declared_topics() -> tuple[TopicSpec, ...]:
    records = (EVENTS_TOPIC, FINDINGS_TOPIC, COMMANDS_TOPIC)
    audit = (
        *(dlq_topic(name) for name in records),
        UNAUTHENTICATED_COMMANDS_TOPIC,
        UNAUTHENTICATED_FINDINGS_TOPIC,
    )
    return (
        *(TopicSpec(name, config=_deleted_after(RECORDS_RETENTION_MS)) for name in records),
        *(TopicSpec(name, config=_deleted_after(AUDIT_RETENTION_MS)) for name in audit),
        TopicSpec(BLOCKLIST_TOPIC, config=dict(BLOCKLIST_TOPIC_CONFIG)),
    )
