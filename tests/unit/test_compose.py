"""The compose file cannot run here (no Docker engine); check that it parses and is complete,
and that its Prometheus and Grafana name metrics that exist (docs/operations.md#metrics)."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from tests.documented_metrics import documented

from tailguard.system.services import SERVICE_NAMES

COMPOSE = Path(__file__).resolve().parents[2] / "compose" / "docker-compose.yml"


def _services() -> dict[str, dict]:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def test_every_tailguard_service_runs_its_worker() -> None:
    services = _services()
    for name in SERVICE_NAMES:
        assert name in services, f"compose has no {name} service"
        entry = services[name]["entrypoint"]
        # In the foreground, as a container needs it (`tailguard services run NAME`).
        assert entry[:4] == ["tailguard", "services", "run", name]
        assert services[name]["environment"]["TAILGUARD_BOOTSTRAP_SERVERS"] == "kafka:9092"


def test_kafka_runs_in_kraft_mode_and_spark_has_workers() -> None:
    services = _services()
    kafka = services["kafka"]["environment"]
    assert "controller" in kafka["KAFKA_PROCESS_ROLES"]
    assert "ZOOKEEPER" not in " ".join(kafka)
    workers = [n for n in services if n.startswith("spark-worker")]
    assert len(workers) >= 2
    for name in workers:
        assert "spark://spark-master:7077" in services[name]["entrypoint"]


# ---------------------------------------------------------------------- Prometheus and Grafana

PROMETHEUS = COMPOSE.parent / "prometheus"
GRAFANA = COMPOSE.parent / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "tailguard.json"
_METRIC = re.compile(r"\btailguard_[a-z0-9_]+")
_SELECTOR_LABEL = re.compile(r"([a-z_]+)\s*(?:=~|!~|!=|=)\s*\"")
_GROUPING = re.compile(r"\b(?:by|on|ignoring|without|group_left|group_right)\s*\(([^)]*)\)")
# Labels Prometheus adds itself, and a histogram bucket's bound.
_OWN_LABELS = {"job", "instance", "le", "job_name"}


def _yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    queries += [v["query"]["query"] for v in dashboard["templating"]["list"]]
    return queries


def _alert_queries() -> list[str]:
    rules = _yaml(PROMETHEUS / "alerts.yml")
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


def _problems_in(query: str) -> list[str]:
    """Metrics a query names that are not in docs/operations.md, and labels none of them has."""
    docs = documented()
    histograms = {d.name for d in docs.values() if d.type == "histogram"}
    names = set()
    for found in _METRIC.findall(query):
        base = re.sub(r"_(bucket|count|sum)$", "", found)
        names.add(base if base in histograms else found)
    problems = [f"{name} is not a documented metric" for name in names if name not in docs]
    labels = set(_SELECTOR_LABEL.findall(query))
    for group in _GROUPING.findall(query):
        labels |= {label.strip() for label in group.split(",") if label.strip()}
    known = _OWN_LABELS.union(*(docs[n].labels for n in names if n in docs))
    problems += [f"label {label} is on none of {sorted(names)}" for label in labels - known]
    return problems


def test_prometheus_grafana_and_a_pushgateway_run_beside_the_services() -> None:
    services = _services()
    for name in ("prometheus", "grafana", "pushgateway"):
        assert name in services, f"compose has no {name}"
    assert "./prometheus:/etc/prometheus:ro" in services["prometheus"]["volumes"]
    mounts = dict(v.rsplit(":", 1)[0].split(":") for v in services["grafana"]["volumes"])
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    provider = _yaml(GRAFANA / "provisioning" / "dashboards" / "tailguard.yml")["providers"][0]
    assert mounts["./grafana/dashboards"] == provider["options"]["path"]


def test_prometheus_scrapes_every_service_the_drivers_and_the_pushgateway() -> None:
    services = _services()
    jobs = {j["job_name"]: j for j in _yaml(PROMETHEUS / "prometheus.yml")["scrape_configs"]}
    targets = set(jobs["tailguard-services"]["static_configs"][0]["targets"])
    for name in SERVICE_NAMES:
        entry = services[name]["entrypoint"]
        port = entry[entry.index("--metrics-port") + 1]
        assert f"{name}:{port}" in targets
    assert jobs["tailguard-agent"]["file_sd_configs"]
    assert jobs["pushgateway"]["honor_labels"] is True
    pushgateway = services["pushgateway"]["ports"][0].split(":")[-1]
    assert jobs["pushgateway"]["static_configs"][0]["targets"] == [f"pushgateway:{pushgateway}"]


def test_the_dashboard_queries_name_metrics_that_exist() -> None:
    datasource = _yaml(GRAFANA / "provisioning" / "datasources" / "prometheus.yml")
    uid = datasource["datasources"][0]["uid"]
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert {p["datasource"]["uid"] for p in panels} == {uid}
    titles = {p["title"] for p in dashboard["panels"] if p["type"] == "row"}
    assert titles == {"Services", "Jobs"}
    queries = _dashboard_queries()
    assert len(queries) >= len(panels)
    assert [p for q in queries for p in _problems_in(q)] == []
    # Every service-wide and every per-job idea has a panel.
    named = {m for q in queries for m in _METRIC.findall(q)}
    assert any(m.startswith("tailguard_job_") for m in named)
    assert any(m.startswith("tailguard_service_") for m in named)


def test_the_alert_rules_name_metrics_that_exist() -> None:
    assert [p for q in _alert_queries() for p in _problems_in(q)] == []


def test_the_query_check_can_fail() -> None:
    found = _problems_in('sum by (vertex) (tailguard_service_records_sent_total{service="x"})')
    assert "tailguard_service_records_sent_total is not a documented metric" in found
    found = _problems_in("max by (vertex) (tailguard_service_ready)")
    assert found == ["label vertex is on none of ['tailguard_service_ready']"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="no promtool (Debian: prometheus)")
def test_promtool_accepts_the_configuration_and_the_rules() -> None:
    checked = subprocess.run(
        ["promtool", "check", "config", str(PROMETHEUS / "prometheus.yml")],
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout and "rules found" in checked.stdout
