"""The fleet list on the broker: `tailguard blocklist add|list|remove`, signed, folded like a
compacted topic; entries not signed by a fleet writer are ignored."""

from __future__ import annotations

import json
import uuid

import pytest

from tailguard import cli
from tailguard.blocklist import fleet_topic
from tailguard.kafka.signing import SIGNER_HEADER
from tailguard.kafka.topic_scan import read_only_consumer, read_to_end
from tailguard.model.config import Settings
from tailguard.model.fleet import FleetBlock, current_entries
from tailguard.testing import Broker

KEY = "k" * 43


@pytest.fixture
def settings(tailguard_broker: Broker) -> Settings:
    return Settings(
        {"bootstrap.servers": tailguard_broker.bootstrap, "security.command-signing.key": KEY}
    )


@pytest.fixture
def host() -> str:
    # The topic is shared by the session: each test owns its hosts.
    return f"host-{uuid.uuid4().hex[:8]}"


def _cli(settings: Settings, tmp_path, monkeypatch, *argv: str) -> int:  # type: ignore[no-untyped-def]
    config = tmp_path / "tailguard.toml"
    config.write_text("".join(f'"{k}" = "{v}"\n' for k, v in settings.overrides().items()))
    return cli.main(["--config", str(config), "blocklist", *argv])


def test_add_list_remove(settings, host, tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    assert (
        _cli(settings, tmp_path, monkeypatch, "add", host, "--for", "5 min", "--reason", "disk")
        == 0
    )
    assert _cli(settings, tmp_path, monkeypatch, "list", "--json") == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if "{" in line]
    [row] = [r for r in rows if r["host"] == host]
    assert row["cause"] == "operator: disk" and row["id"].startswith("operator-")
    assert row["evidence"] == [row["id"]]
    assert _cli(settings, tmp_path, monkeypatch, "remove", host) == 0
    now = row["until_ts"] - 1
    assert host not in current_entries(fleet_topic.read_changes(settings), now)


def test_export_both_ways(settings, host, tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    # One export: `tailguard blocklist export` and `python -m tailguard.observer export` (which
    # calls the blocklist's, observe mode being the layer above) print the same list.
    from tailguard.observer.__main__ import main as observer_main

    assert (
        _cli(settings, tmp_path, monkeypatch, "add", host, "--for", "5 min", "--reason", "x") == 0
    )
    capsys.readouterr()
    assert _cli(settings, tmp_path, monkeypatch, "export", "--format", "hosts") == 0
    listed = capsys.readouterr().out.splitlines()
    assert host in listed
    config = str(tmp_path / "tailguard.toml")
    assert observer_main(["export", "--format", "hosts", "--config", config]) == 0
    assert capsys.readouterr().out.splitlines() == listed
    assert observer_main(["export", "--format", "yarn", "--config", config]) == 0
    assert host in capsys.readouterr().out.split("=", 1)[1].strip().split(",")
    assert _cli(settings, tmp_path, monkeypatch, "remove", host) == 0


def test_bad_duration_is_a_usage_error(settings, host, tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    code = _cli(settings, tmp_path, monkeypatch, "add", host, "--for", "soon", "--reason", "x")
    assert code == 2 and "--for" in capsys.readouterr().err


def test_an_entry_from_another_signer_or_unsigned_is_ignored(settings, host) -> None:  # type: ignore[no-untyped-def]
    entry = FleetBlock(job_id="x", ts=1, id="x-1", host=host, until_ts=2**50, evidence=("f",))
    fleet_topic.publish(settings, entry, "speculator")  # signed, but no fleet writer
    fleet_topic.publish(
        Settings({"bootstrap.servers": settings["bootstrap.servers"]}), entry, "blocklist"
    )
    assert all(c.host != host for c in fleet_topic.read_changes(settings))
    fleet_topic.publish(settings, entry, "blocklist")
    [read] = [c for c in fleet_topic.read_changes(settings) if c.host == host]
    assert read == entry
    assert SIGNER_HEADER  # the header the reader checked


def test_a_hosts_entries_share_a_partition_whichever_client_wrote_them(settings) -> None:  # type: ignore[no-untyped-def]
    # The blocklist service (faust, over aiokafka) writes a host's entries where Kafka's Java
    # client would: murmur2 of the key. An operator's entry (`tailguard blocklist add|remove`,
    # over librdkafka) must land in the same partition, or compaction keeps both and a reader
    # folding the partitions may see a removed host still listed.
    from aiokafka.partitioner import DefaultPartitioner

    hosts = [f"host-{uuid.uuid4().hex[:8]}" for _ in range(16)]
    for h in hosts:
        fleet_topic.publish(settings, fleet_topic.operator_removal(h, 1), "operator")
    consumer = read_only_consumer(settings, "tailguard-test-partitions")
    try:
        messages = list(read_to_end(consumer, fleet_topic.BLOCKLIST_TOPIC))
    finally:
        consumer.close()
    written = {(m.key() or b"").decode(): m.partition() for m in messages}
    partitions = sorted(set(written.values()) | {0, 1, 2, 3})
    aiokafka = DefaultPartitioner()
    expected = {h: aiokafka(h.encode(), partitions, partitions) for h in hosts}
    assert {h: written[h] for h in hosts} == expected
    assert len(set(expected.values())) > 1  # the keys spread: the test can tell hashes apart


def test_encoding_round_trip_and_tombstone() -> None:
    entry = FleetBlock(
        job_id="j", ts=5, id="i", host="h", until_ts=9, cause="c", evidence=("a", "b")
    )
    key, value = fleet_topic.encode(entry)
    assert fleet_topic.decode(key, value) == entry
    removed = FleetBlock(job_id="j", ts=5, id="i", host="h", until_ts=None)
    assert fleet_topic.encode(removed) == (b"h", None)
    assert fleet_topic.decode(b"h", None).removed
    with pytest.raises(ValueError, match="not a FleetBlock"):
        fleet_topic.decode(b"h", b"\x00" * 20)
