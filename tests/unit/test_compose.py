"""The compose file cannot run here (no Docker engine); check that it parses and is complete."""

from pathlib import Path

import yaml

from tailguard.shell.definition import SERVICE_NAMES

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
