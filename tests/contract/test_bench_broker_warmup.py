"""The bench's broker warm-up, against Apache Kafka: every record reaches every reader, and the
warm-up leaves no topic behind."""

from __future__ import annotations

from confluent_kafka.admin import AdminClient

from tailguard.bench import broker_warmup
from tailguard.model.config import Settings


def _warm_up_topics(bootstrap: str) -> set[str]:
    topics = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics
    return {t for t in topics if t.startswith(broker_warmup.TOPIC)}


def test_every_reader_reads_every_record_and_the_topic_is_gone_afterwards(
    kafka_bootstrap: str,
) -> None:
    settings = Settings({"bootstrap.servers": kafka_bootstrap})

    done = broker_warmup.warm_broker(settings, records=60, readers=2, deadline_s=60.0)

    assert (done.records, done.readers) == (60, 2)
    assert 0 < done.seconds < 60.0
    assert _warm_up_topics(kafka_bootstrap) == set()


def test_a_deadline_that_passes_before_the_readers_are_assigned_fails_and_cleans_up(
    kafka_bootstrap: str,
) -> None:
    settings = Settings({"bootstrap.servers": kafka_bootstrap})
    # A clock 100 s on at every reading after the first: the deadline has passed as soon as the
    # topic exists, before any reader could join its group.
    readings = iter(range(0, 10_000, 100))

    try:
        broker_warmup.warm_broker(
            settings, records=10, deadline_s=30.0, clock=lambda: float(next(readings))
        )
    except broker_warmup.WarmUpFailed as err:
        assert "assigned" in str(err)
    else:
        raise AssertionError("a warm-up past its deadline returned")
    assert _warm_up_topics(kafka_bootstrap) == set()
