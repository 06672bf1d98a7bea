"""Log backends for the contract suite: every test runs against each backend.

- "embedded": the embedded broker (librdkafka's mock cluster in a background process): the
  tailguard pytest plugin's `tailguard_broker`, started once per session and stopped at the end.
- "kafka": a real Kafka broker in KRaft mode via testcontainers; skipped with the reason when no
  Docker engine is reachable (as on the development machines).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tailguard.model.config import Settings
from tailguard.testing import Broker

BACKENDS = ("embedded", "kafka")

# How long to wait for Docker to answer a ping: no engine should cost seconds, not minutes.
_DOCKER_PING_TIMEOUT_S = 3


def _docker_unreachable_reason() -> str | None:
    try:
        import docker

        docker.from_env(timeout=_DOCKER_PING_TIMEOUT_S).ping()
    except Exception as err:
        return f"no reachable Docker engine for testcontainers' Kafka ({type(err).__name__}: {err})"
    return None


@pytest.fixture(scope="session")
def embedded_bootstrap(tailguard_broker: Broker) -> str:
    return tailguard_broker.bootstrap


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    reason = _docker_unreachable_reason()
    if reason is not None:
        pytest.skip(reason)
    from testcontainers.community.kafka import KafkaContainer

    with KafkaContainer().with_kraft() as kafka:
        yield kafka.get_bootstrap_server()


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def settings(backend: str, request: pytest.FixtureRequest) -> Settings:
    bootstrap = request.getfixturevalue(f"{backend}_bootstrap")
    return Settings({"bootstrap.servers": bootstrap})


@pytest.fixture(scope="session")
def codec(settings: Settings) -> Any:
    from tailguard.codec import codec_for

    return codec_for(settings)


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    """A topic no other test uses (the broker is shared by the whole session)."""
    return f"test.{request.node.originalname}.{uuid.uuid4().hex[:12]}"


@pytest.fixture
def group_id() -> str:
    return f"group-{uuid.uuid4().hex[:12]}"
