"""The metrics docs/operations.md lists (its `## Metrics` tables), for the tests that hold the
code, the dashboard and the alert rules to that list."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tailguard.system.services import SERVICE_NAMES

OPERATIONS = Path(__file__).resolve().parents[1] / "docs" / "operations.md"
AGENT = "agent"
_ROW = re.compile(r"^\|\s*`(tailguard_[a-z0-9_]+)`\s*\|(.*)\|\s*$")


@dataclass(frozen=True)
class DocumentedMetric:
    name: str  # as queried: a counter with its `_total`
    type: str  # counter, gauge, histogram
    labels: frozenset[str]
    unit: str
    exporters: frozenset[str]  # service names, or "agent"

    @property
    def family(self) -> str:
        """The name of its family in a scrape (a counter's without `_total`)."""
        return self.name.removesuffix("_total") if self.type == "counter" else self.name


def _exporters(text: str) -> frozenset[str]:
    if text == "every service":
        return frozenset(SERVICE_NAMES)
    names = frozenset(n.strip() for n in text.split(","))
    unknown = names - {*SERVICE_NAMES, AGENT}
    if unknown:
        raise ValueError(f"docs/operations.md names unknown exporters {sorted(unknown)}")
    return names


def documented() -> dict[str, DocumentedMetric]:
    """name -> what the Metrics section says of it (metric | type | labels | unit | exported
    by | meaning)."""
    text = OPERATIONS.read_text()
    section = text[text.index("\n## Metrics\n") :]
    section = section[: section.find("\n## ", 1)]
    found: dict[str, DocumentedMetric] = {}
    for line in section.splitlines():
        match = _ROW.match(line)
        if match is None:
            continue
        name, rest = match.groups()
        cells = [c.strip() for c in rest.split("|")]
        kind, labels, unit, exporters = cells[0], cells[1], cells[2], cells[3]
        if name in found:
            raise ValueError(f"docs/operations.md lists {name} twice")
        found[name] = DocumentedMetric(
            name=name,
            type=kind,
            labels=frozenset(lab.strip() for lab in labels.split(",") if lab.strip()),
            unit=unit,
            exporters=_exporters(exporters),
        )
    if not found:
        raise ValueError("docs/operations.md has no metrics table")
    return found


def problems(scrapes: dict[str, str]) -> list[str]:
    """Differences between the tables and what each exporter (a service's name, or "agent")
    exported (its /metrics text), both ways: every metric listed is exported, with its type
    and labels, by exactly the exporters named; every `tailguard_*` metric exported is listed.
    Labels are compared where a metric has samples (a labelled metric nobody has used yet
    shows only its name and type)."""
    from prometheus_client.parser import text_string_to_metric_families

    docs = documented()
    by_family = {d.family: d for d in docs.values()}
    found: list[str] = []
    exported: dict[str, set[str]] = {}
    for exporter, text in scrapes.items():
        for family in text_string_to_metric_families(text):
            if not family.name.startswith("tailguard_"):
                continue
            doc = by_family.get(family.name)
            if doc is None:
                found.append(f"{exporter} exports {family.name} ({family.type}), not listed")
                continue
            exported.setdefault(doc.name, set()).add(exporter)
            if family.type != doc.type:
                found.append(f"{doc.name}: {exporter} exports a {family.type}, listed {doc.type}")
            labels = {k for s in family.samples for k in s.labels if k != "le"}
            if family.samples and labels != doc.labels:
                found.append(
                    f"{doc.name}: {exporter} labels {sorted(labels)}, listed {sorted(doc.labels)}"
                )
    for doc in docs.values():
        expected = doc.exporters & set(scrapes)
        if exported.get(doc.name, set()) != expected:
            found.append(
                f"{doc.name}: exported by {sorted(exported.get(doc.name, set()))}, "
                f"listed for {sorted(expected)}"
            )
    return found
