"""Reading whole topics with self-managed partition assignment and group-committed offsets.

Each tailguard reader is the only reader of its topic (a service's output must be a pure
function of that topic's order), so there is nothing to balance between group members. The
reader therefore assigns itself every partition of its topics and uses its group id only to
commit and fetch offsets. That also sidesteps two behaviours of librdkafka's mock cluster: a
3 s delay before the first rebalance of a group, and a stalled rebalance when a subscription's
topic appears after the consumer joined (seen with librdkafka 2.16).

Topics need not exist yet (the mock broker creates a topic on its first produce): a missing
topic is looked up again every `discovery_interval_s` while polling, and assigned from its
committed offsets (or the beginning/end, or `start_at_ms`) as soon as it appears. A broker that
cannot be reached meanwhile only delays that: the lookup is tried again, the reader goes on.

`start_at_ms` (a reader without committed offsets, such as a job's agent) starts each partition
at its first record stamped at or after that time (Kafka's offsets-for-times index), so what the
reader skips does not depend on how much history the topic holds. No record stamped from then on
is skipped, however late the partition is assigned: see `start_offsets`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from tailguard.kafka.config import FETCH_WAIT_KEY, client_config, fetch_wait

log = logging.getLogger(__name__)

READER_DEFAULTS: Mapping[str, Any] = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    # Do not let a lookup of a missing topic create it with broker defaults.
    "allow.auto.create.topics": False,
    "log_level": 3,
}
# The fetch wait on the mock broker, which answers a fetch with no data only when the wait
# expires (kafka_config.fetch_wait): short, since an agent's commands wait on it, and cheap,
# since librdkafka's empty fetches cost no Python work. On Kafka a reader switches to Kafka's
# own default at its first look at the cluster.
EMBEDDED_FETCH_WAIT_MS = 5

# Errors seen in normal operation: the end of a partition; a topic that does not exist yet.
IGNORABLE_ERRORS = (KafkaError._PARTITION_EOF, KafkaError.UNKNOWN_TOPIC_OR_PART)

_METADATA_TIMEOUT_S = 5.0
# How often a reader asks which cluster answers (one metadata request for one of its topics:
# negligible), and how long it waits for the answer while polling.
CLUSTER_CHECK_INTERVAL_S = 1.0
CLUSTER_CHECK_TIMEOUT_S = 1.0


class TopicReader:
    """Raw messages of `topics`, every partition, resuming from `group_id`'s committed offsets."""

    def __init__(
        self,
        settings: Mapping[str, str],
        topics: Iterable[str],
        group_id: str,
        *,
        from_beginning: bool = True,
        start_at_ms: int | None = None,
        config: Mapping[str, Any] | None = None,
        discovery_interval_s: float = 0.1,
    ) -> None:
        self.topics = list(dict.fromkeys(topics))
        self.group_id = group_id
        self.from_beginning = from_beginning
        self.start_at_ms = start_at_ms
        self.discovery_interval_s = discovery_interval_s
        defaults = {
            **READER_DEFAULTS,
            "group.id": group_id,
            # Also where to go when the committed offset is no longer on the broker (deleted by
            # retention; the mock broker keeps only the newest ~5 MB of each partition).
            "auto.offset.reset": "earliest" if from_beginning else "latest",
        }
        self._config = {**client_config(settings, "consumer", defaults), **(config or {})}
        # A wait the caller or the settings chose stays; else it follows the cluster.
        self._wait_follows_cluster = FETCH_WAIT_KEY not in self._config
        if self._wait_follows_cluster:
            self._config[FETCH_WAIT_KEY] = EMBEDDED_FETCH_WAIT_MS
        self.consumer = Consumer(self._config)
        self._missing = set(self.topics)
        self._next_discovery = 0.0
        # Next offset to commit per (topic, partition): one past the last message handed out.
        self._positions: dict[tuple[str, int], int] = {}
        # Committed offsets not yet reached: the first message of such a partition tells
        # whether the broker still had everything after the commit.
        self._resume_at: dict[tuple[str, int], int] = {}
        # The cluster id last seen, and when to look again (see `_follow_cluster`).
        self._cluster_id: str | None = None
        self._next_cluster_check = 0.0

    @property
    def waiting_for(self) -> set[str]:
        """Topics that do not exist (yet)."""
        return set(self._missing)

    def _discover(self) -> None:
        """Assign the topics that exist now: every one's start positions are looked up first,
        then all are assigned at once. Assigned, a partition is fetched at once, and on Kafka
        an idle fetch waits up to `fetch.wait.max.ms` (500 ms) at the broker, which answers a
        connection's requests in order: each offset lookup made after it waited behind it.
        Looking up one topic after assigning the other took an agent's decision reader 2.5 s
        before it read anything (measured on Apache Kafka: 5 lookups behind 500 ms fetches),
        and the job's first attempt waited for the decider's first command as long."""
        now = time.monotonic()
        if not self._missing or now < self._next_discovery:
            return
        self._next_discovery = now + self.discovery_interval_s
        found: dict[str, tuple[list[TopicPartition], list[TopicPartition]]] = {}
        for topic in sorted(self._missing):
            try:
                positions = self._start_positions(topic)
            except KafkaException as err:
                if err.args and isinstance(err.args[0], KafkaError) and err.args[0].fatal():
                    raise
                # The broker is out of reach (or restarting): looked up again next time.
                log.debug("%s: topic lookup failed, retrying: %s", topic, err)
                continue
            if positions is not None:
                found[topic] = positions
        if not found:
            return
        self.consumer.incremental_assign([tp for start, _ in found.values() for tp in start])
        for topic, (_, committed) in found.items():
            for tp in committed:
                if tp.offset >= 0:
                    self._resume_at[(tp.topic, tp.partition)] = tp.offset
            self._missing.discard(topic)

    def _start_positions(
        self, topic: str
    ) -> tuple[list[TopicPartition], list[TopicPartition]] | None:
        """Where to start reading each of `topic`'s partitions, and their committed offsets;
        None if the topic does not exist (yet)."""
        meta = self.consumer.list_topics(topic, timeout=_METADATA_TIMEOUT_S).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            return None
        wanted = [TopicPartition(topic, p) for p in sorted(meta.partitions)]
        committed = self.consumer.committed(wanted, timeout=_METADATA_TIMEOUT_S)
        unread = [tp for tp in committed if tp.offset < 0]
        if self.start_at_ms is not None and unread:
            starts = self.start_offsets(unread, self.start_at_ms)
        else:
            default = OFFSET_BEGINNING if self.from_beginning else OFFSET_END
            starts = {(tp.topic, tp.partition): default for tp in unread}
        start = [
            TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else
                           starts[(tp.topic, tp.partition)])
            for tp in committed
        ]  # fmt: skip
        return start, committed

    def start_offsets(
        self, partitions: list[TopicPartition], start_at_ms: int
    ) -> dict[tuple[str, int], int]:
        """Per partition, the offset of its first record stamped at or after `start_at_ms`.

        Where there is none yet, the partition's end offset read *before* the lookup: every
        record below it was on the broker when the lookup found none stamped late enough, so
        skipping them skips nothing wanted, and whatever arrives meanwhile lies at or above it.
        (The end read after the lookup, or `OFFSET_END` resolved at the first fetch, would skip a
        record that arrived in between.)"""
        ends = {
            (tp.topic, tp.partition): self.consumer.get_watermark_offsets(
                tp, timeout=_METADATA_TIMEOUT_S
            )[1]
            for tp in partitions
        }
        found = self.consumer.offsets_for_times(
            [TopicPartition(tp.topic, tp.partition, start_at_ms) for tp in partitions],
            timeout=_METADATA_TIMEOUT_S,
        )
        starts = {(tp.topic, tp.partition): tp.offset for tp in found if tp.offset >= 0}
        unanswered = [
            TopicPartition(tp.topic, tp.partition, ends[(tp.topic, tp.partition)] - 1)
            for tp in found
            if tp.offset < 0 and ends[(tp.topic, tp.partition)] > 0
        ]
        # "None stamped that late" is also what a broker without a time index says (librdkafka's
        # mock cluster, `broker up --mock`): where the partition's last record says otherwise,
        # read it from its beginning (the mock keeps ~5 MB per partition: a bounded read).
        # Kafka's index never answers so (its last record would be found): kept for the mock.
        late = self._stamped_since(unanswered, start_at_ms)
        for tp in found:
            where = (tp.topic, tp.partition)
            if where not in starts:
                starts[where] = OFFSET_BEGINNING if where in late else ends[where]
        return starts

    def _stamped_since(
        self, last_records: list[TopicPartition], start_at_ms: int
    ) -> set[tuple[str, int]]:
        """The partitions whose record at the given offset is stamped at or after
        `start_at_ms` (read by a probe of their own, so this reader's positions stay put)."""
        if not last_records:
            return set()
        probe = Consumer({**self._config, "group.id": f"{self.group_id}-probe"})
        try:
            probe.assign(last_records)
            stamps: dict[tuple[str, int], int] = {}
            deadline = time.monotonic() + _METADATA_TIMEOUT_S
            while len(stamps) < len(last_records) and time.monotonic() < deadline:
                msg = probe.poll(0.1)
                if msg is not None and msg.error() is None:
                    stamps[(str(msg.topic()), msg.partition() or 0)] = msg.timestamp()[1]
        finally:
            probe.close()
        return {where for where, ts in stamps.items() if ts >= start_at_ms}

    def poll(self, timeout: float, max_messages: int = 1000) -> list[Message]:
        """The messages that arrive within `timeout` seconds, errors filtered out."""
        deadline = time.monotonic() + timeout
        while True:
            # The cluster first: on Kafka the reader starts again with a longer fetch wait,
            # which is free before anything is assigned.
            self._follow_cluster()
            self._discover()
            # Whatever is queued already, without waiting; else wait for the first message
            # only (consume(n, t) would wait for n messages or t: latency) and take the rest
            # that came with it.
            batch = self.consumer.consume(max_messages, 0)
            if not batch:
                remaining = max(0.0, deadline - time.monotonic())
                # While a topic is missing, wait in short slices so it is picked up promptly.
                wait = min(remaining, self.discovery_interval_s) if self._missing else remaining
                first = self.consumer.poll(wait)
                if first is not None:
                    batch = [first]
                    if max_messages > 1:
                        batch.extend(self.consumer.consume(max_messages - 1, 0))
            messages = [m for m in batch if _usable(m) and self._recent(m)]
            if messages or time.monotonic() >= deadline:
                break
        for msg in messages:
            where, offset = (str(msg.topic()), msg.partition() or 0), msg.offset() or 0
            if self._resume_at and where in self._resume_at:
                self._check_gap(where, self._resume_at.pop(where), offset)
            self._positions[where] = offset + 1
        return messages

    def _follow_cluster(self) -> None:
        """Read a new cluster's log from its start. A mock broker restarted empty numbers
        its log from 0 again; a reader whose position is at or below the new log's end is not
        out of range, so librdkafka's reset never fires and it would skip every record below
        its old position (the chaos suite's broker case lost a speculative launch this way).
        Real Kafka keeps its cluster id across restarts: this never fires there."""
        now = time.monotonic()
        if now < self._next_cluster_check:
            return
        self._next_cluster_check = now + CLUSTER_CHECK_INTERVAL_S
        try:
            # One topic's metadata carries the cluster id too: not every topic's, every second,
            # from every job's agent on a real cluster.
            metadata = self.consumer.list_topics(self.topics[0], timeout=CLUSTER_CHECK_TIMEOUT_S)
            cluster_id = metadata.cluster_id
        except KafkaException:
            return  # unreachable: looked at again at the next check
        if not cluster_id:
            return
        if self._cluster_id is None:
            self._fit_fetch_wait(cluster_id)
        if self._cluster_id is not None and cluster_id != self._cluster_id:
            assigned = self.consumer.assignment()
            log.warning(
                "%s: the broker answers as cluster %s, not %s: a new log, read from its start",
                self.group_id, cluster_id, self._cluster_id,
            )  # fmt: skip
            if assigned:
                self.consumer.incremental_unassign(assigned)
                self.consumer.incremental_assign(
                    [TopicPartition(tp.topic, tp.partition, OFFSET_BEGINNING) for tp in assigned]
                )
            self._positions.clear()
            self._resume_at.clear()
        self._cluster_id = cluster_id

    def _fit_fetch_wait(self, cluster_id: str) -> None:
        """On Kafka, Kafka's default fetch wait: with the mock broker's short one, an idle
        reader would ask the broker 200 times a second, and every job's agent has one."""
        if not self._wait_follows_cluster:
            return
        # No wait was configured (the settings' would be in the reader's config): the rule's.
        wait = fetch_wait({}, cluster_id, EMBEDDED_FETCH_WAIT_MS).ms
        if wait == self._config[FETCH_WAIT_KEY]:
            return
        if self.consumer.assignment() or self._positions:
            # Reached only after the broker was out of reach at the first looks: reading goes
            # on with the short wait rather than start again.
            log.info("%s: cluster %s reached late: fetches keep a %d ms wait",
                     self.group_id, cluster_id, self._config[FETCH_WAIT_KEY])  # fmt: skip
            return
        self.consumer.close()
        self._config[FETCH_WAIT_KEY] = wait
        self.consumer = Consumer(self._config)
        self._missing = set(self.topics)

    def _recent(self, msg: Message) -> bool:
        """Not stamped before `start_at_ms` (what a partition read from its beginning, on a
        broker without a time index, holds from before)."""
        if self.start_at_ms is None:
            return True
        kind, ts = msg.timestamp()
        return kind == TIMESTAMP_NOT_AVAILABLE or ts >= self.start_at_ms

    def _check_gap(self, where: tuple[str, int], committed: int, first: int) -> None:
        if first > committed:
            log.warning(
                "%s[%d]: records %d..%d were gone from the broker when %s resumed "
                "(deleted by retention; the mock broker keeps only the newest ~5 MB per "
                "partition)",
                *where, committed, first - 1, self.group_id,
            )  # fmt: skip

    def commit(self) -> None:
        """Commit (synchronously) the offsets of everything handed out so far."""
        if not self._positions:
            return
        offsets = [TopicPartition(t, p, o) for (t, p), o in self._positions.items()]
        self.consumer.commit(offsets=offsets, asynchronous=False)
        self._positions.clear()

    def close(self) -> None:
        self.consumer.close()


def _usable(msg: Message) -> bool:
    err = msg.error()
    if err is None:
        return True
    if err.code() in IGNORABLE_ERRORS:
        return False
    if err.fatal():
        raise KafkaException(err)
    # Transient (broker unreachable and the like): librdkafka retries by itself.
    return False
