"""Choosing the codec from the settings: single-object unless a schema registry is configured."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from tailguard.codec.confluent import ConfluentCodec
from tailguard.codec.protocol import RecordCodec
from tailguard.codec.single_object import SingleObjectCodec

if TYPE_CHECKING:
    # At use (registry_client): the client's import is heavy (codec/confluent.py says why).
    from confluent_kafka.schema_registry import SchemaRegistryClient

REGISTRY_PREFIX = "schema-registry."
REGISTRY_URL = REGISTRY_PREFIX + "url"

# A `mock://` registry lives inside its client; sharing one client per URL lets every codec of a
# process see the same registry, as they would with a real one.
_mock_clients: dict[str, SchemaRegistryClient] = {}
_mock_lock = threading.Lock()


def registry_client(settings: Mapping[str, Any]) -> SchemaRegistryClient:
    """A client for the registry of `settings`: every `schema-registry.*` key, prefix removed."""
    conf = {
        key[len(REGISTRY_PREFIX) :]: value
        for key, value in settings.items()
        if key.startswith(REGISTRY_PREFIX)
    }
    from confluent_kafka.schema_registry import SchemaRegistryClient

    url = str(conf["url"])
    if not url.startswith("mock://"):
        return SchemaRegistryClient(conf)
    with _mock_lock:
        client = _mock_clients.get(url)
        if client is None:
            client = SchemaRegistryClient.new_client(conf)
            _mock_clients[url] = client
        return client


def codec_for(settings: Mapping[str, Any]) -> RecordCodec:
    url = str(settings.get(REGISTRY_URL) or "").strip()
    if not url:
        return SingleObjectCodec()
    return ConfluentCodec(registry_client({**settings, REGISTRY_URL: url}))
