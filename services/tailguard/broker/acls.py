"""Who may do what on a secured Kafka: the principals and ACLs of docs/security.md, as data.

One principal per role: `tailguard-<service>` for each of the five services, `tailguard-agent`
for every job's agent, `tailguard-auditor` for `tailguard replay --topic` and people reading the
log, and `tailguard-admin`, the only super user (the broker itself and whoever creates topics
and ACLs). The secured embedded broker (`tailguard broker up --secure`) creates exactly these
ACLs; on an existing cluster, the `kafka-acls.sh` lines `tailguard broker acls` prints from the
same table do the same (`acl_commands`). Kafka denies whatever no ACL allows
(`allow.everyone.if.no.acl.found` is false by default), so these are the whole of each
principal's rights.

The services' rows follow the services' table (tailguard/system/services.py: each one's input
topic and the topics of its outputs; shell/processor.py adds the dead letters for the input
topic), which the log layer does not import; tests/unit/test_kafka_acls.py checks that they
agree, and that docs/security.md's table says the same.
"""

from __future__ import annotations

from dataclasses import dataclass

from tailguard.model.fleet import BLOCKLIST_TOPIC
from tailguard.model.records import COMMANDS_TOPIC, EVENTS_TOPIC, FINDINGS_TOPIC

ADMIN = "tailguard-admin"
AGENT = "tailguard-agent"
AUDITOR = "tailguard-auditor"
SERVICE_PRINCIPAL = "tailguard-{service}"
# The agents' consumer groups: one per job, `tailguard-agent-<job id>`.
AGENT_GROUPS = "tailguard-agent-"
REPLAY_GROUP = "tailguard-replay"
# The dead-letter reader's groups (kafka/dead_letters.py): `tailguard-dlq-reader-<uuid>`.
DLQ_READER_GROUPS = "tailguard-dlq-reader-"


def _dlq(topic: str) -> str:
    # kafka/dead_letters.dlq_topic, without importing the consumer side here.
    return f"{topic}.dlq"


@dataclass(frozen=True)
class Acl:
    """Allow `principal` (a name, without `User:`) `operation` on a resource."""

    principal: str
    operation: str  # "Read", "Write", "Describe"
    resource: str  # "topic" or "group"
    name: str
    prefixed: bool = False  # the name is a prefix (Kafka's PREFIXED pattern type)


# service -> (input topic, topics it writes besides the input's dead letters)
SERVICE_TOPICS: dict[str, tuple[str, tuple[str, ...]]] = {
    "detector": (EVENTS_TOPIC, (FINDINGS_TOPIC,)),
    "decider": (EVENTS_TOPIC, (COMMANDS_TOPIC,)),
    "failover": (EVENTS_TOPIC, (COMMANDS_TOPIC,)),
    "speculator": (FINDINGS_TOPIC, (COMMANDS_TOPIC,)),
    # The fleet list is a table the blocklist both writes and folds at its start.
    "blocklist": (FINDINGS_TOPIC, (COMMANDS_TOPIC, BLOCKLIST_TOPIC)),
}


def service_principal(service: str) -> str:
    return SERVICE_PRINCIPAL.format(service=service)


def _service_acls(service: str) -> list[Acl]:
    principal = service_principal(service)
    source, outputs = SERVICE_TOPICS[service]
    reads = [source, *([BLOCKLIST_TOPIC] if BLOCKLIST_TOPIC in outputs else [])]
    return [
        *(Acl(principal, "Read", "topic", topic) for topic in reads),
        *(Acl(principal, "Write", "topic", topic) for topic in (*outputs, _dlq(source))),
        # Its consumer group, and the group its state rebuild probes (`<group>-probe`).
        Acl(principal, "Read", "group", principal, prefixed=True),
    ]


def declared_acls() -> tuple[Acl, ...]:
    """Every ACL tailguard's principals need, and no more."""
    agent = [
        Acl(AGENT, "Write", "topic", EVENTS_TOPIC),
        # Its own fallback decisions, so the topics alone are a complete log.
        Acl(AGENT, "Write", "topic", COMMANDS_TOPIC),
        Acl(AGENT, "Read", "topic", COMMANDS_TOPIC),
        # The services' inputs for a replay: it archives them.
        Acl(AGENT, "Read", "topic", FINDINGS_TOPIC),
        # Hosts on the fleet list when a job starts.
        Acl(AGENT, "Read", "topic", BLOCKLIST_TOPIC),
        Acl(AGENT, "Write", "topic", _dlq(FINDINGS_TOPIC)),
        Acl(AGENT, "Write", "topic", _dlq(COMMANDS_TOPIC)),
        Acl(AGENT, "Read", "group", AGENT_GROUPS, prefixed=True),
    ]
    auditor = [
        *(Acl(AUDITOR, "Read", "topic", t) for t in (EVENTS_TOPIC, FINDINGS_TOPIC, COMMANDS_TOPIC)),
        *(
            Acl(AUDITOR, "Read", "topic", _dlq(t))
            for t in (EVENTS_TOPIC, FINDINGS_TOPIC, COMMANDS_TOPIC)
        ),
        Acl(AUDITOR, "Read", "group", REPLAY_GROUP),
        Acl(AUDITOR, "Read", "group", DLQ_READER_GROUPS, prefixed=True),
    ]
    services = [acl for service in SERVICE_TOPICS for acl in _service_acls(service)]
    return (*agent, *services, *auditor)


def principals() -> tuple[str, ...]:
    """Every principal with a SCRAM credential on the secured broker, the admin first."""
    return (ADMIN, AGENT, *(service_principal(s) for s in SERVICE_TOPICS), AUDITOR)


def acl_commands(acls: tuple[Acl, ...] | None = None) -> list[str]:
    """The `kafka-acls.sh` arguments that create `acls` on an existing cluster."""
    lines = []
    for acl in declared_acls() if acls is None else acls:
        pattern = " --resource-pattern-type prefixed" if acl.prefixed else ""
        lines.append(
            f"--add --allow-principal User:{acl.principal} --operation {acl.operation} "
            f"--{acl.resource} {acl.name}{pattern}"
        )
    return lines
