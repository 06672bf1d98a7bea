"""The fleet list's schema (schemas/blocklist/FleetBlock.avsc): it mirrors the record, and the
current schema reads every released version of it (backward, as for the record schemas)."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import avro.schema
import pytest
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType

from tailguard.blocklist import fleet_topic
from tailguard.model.fleet import FleetBlock

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
RELEASED = sorted(SCHEMAS.glob("released/*/blocklist/FleetBlock.avsc"))


def _compatible(reader: dict[str, Any], writer: dict[str, Any]) -> Any:
    return (
        ReaderWriterCompatibilityChecker()
        .get_compatibility(
            avro.schema.parse(json.dumps(reader)), avro.schema.parse(json.dumps(writer))
        )
        .compatibility
    )


def test_the_schema_mirrors_the_record() -> None:
    names = [f["name"] for f in fleet_topic.schema_json()["fields"]]
    assert sorted(names) == sorted(f.name for f in dataclasses.fields(FleetBlock))


@pytest.mark.parametrize("released", RELEASED, ids=[p.parts[-3] for p in RELEASED])
def test_current_reads_released(released: Path) -> None:
    writer = json.loads(released.read_text())
    assert _compatible(fleet_topic.schema_json(), writer) is SchemaCompatibilityType.compatible


def test_the_checker_catches_an_incompatible_change() -> None:
    writer = fleet_topic.schema_json()
    reader = copy.deepcopy(writer)
    reader["fields"].append({"name": "node_pool", "type": "string"})  # required, no default
    assert _compatible(reader, writer) is SchemaCompatibilityType.incompatible
    reader["fields"][-1]["default"] = ""
    assert _compatible(reader, writer) is SchemaCompatibilityType.compatible
