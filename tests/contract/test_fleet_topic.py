"""The fleet list on the broker: `tailguard blocklist add|list|remove`, signed, folded like a
compacted topic; entries not signed by a fleet writer are ignored."""

from __future__ import annotations

import json
import uuid

import pytest

from tailguard import cli
from tailguard.blocklist import fleet_topic
from tailguard.kafka.signing import SIGNER_HEADER
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
