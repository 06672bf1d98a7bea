"""Log backends for the contract suite: every test runs against each backend.

- "kafka": Apache Kafka's broker, the embedded default: the tailguard pytest plugin's
  `tailguard_broker`, started once per session and stopped at the end (skipped, saying so, in a
  session run on the mock with `--tailguard-broker mock`).
- "mock": librdkafka's in-memory mock cluster, the offline option (`tailguard broker up
  --mock`), one for the session, so the suite also shows what it still does and lacks.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tailguard.broker.embedded import EmbeddedBroker
from tailguard.model.config import Settings
from tailguard.testing import Broker

BACKENDS = ("kafka", "mock")


@pytest.fixture(scope="session")
def kafka_bootstrap(tailguard_broker: Broker) -> str:
    state = EmbeddedBroker(tailguard_broker.work_dir).status()
    if state is not None and state.kind != "kafka":
        pytest.skip("this session's broker is the mock (--tailguard-broker mock)")
    return tailguard_broker.bootstrap


@pytest.fixture(scope="session")
def mock_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with EmbeddedBroker(tmp_path_factory.mktemp("mock-broker"), mock=True) as bootstrap:
        yield bootstrap


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
