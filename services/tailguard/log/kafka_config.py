"""librdkafka settings shared by the producer and consumer.

Any setting named `kafka.<librdkafka key>` (in the TOML file or as an override) is passed to
both clients, `kafka.producer.<key>` / `kafka.consumer.<key>` to one of them; these win over the
defaults chosen here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tailguard.log.broker import resolve_bootstrap


def client_config(
    settings: Mapping[str, str], role: str, defaults: Mapping[str, Any]
) -> dict[str, Any]:
    """The config for a client of `role` ("producer" or "consumer")."""
    config: dict[str, Any] = {"bootstrap.servers": resolve_bootstrap(settings), **defaults}
    shared, own = "kafka.", f"kafka.{role}."
    others = tuple(f"kafka.{r}." for r in ("producer", "consumer"))
    for key, value in settings.items():
        if key.startswith(own):
            continue
        if key.startswith(shared) and not key.startswith(others):
            config[key[len(shared) :]] = value
    for key, value in settings.items():
        if key.startswith(own):
            config[key[len(own) :]] = value
    return config
