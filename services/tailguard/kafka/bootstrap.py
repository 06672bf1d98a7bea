"""Where a Kafka client connects: `bootstrap.servers`, else the address of the embedded broker
running under the work dir (its state file, `kafka/broker_state.py`). Clients ask here, not the
broker operations (`tailguard.broker`), which start and stop that broker."""

from __future__ import annotations

from collections.abc import Mapping

from tailguard.kafka.broker_state import read_state, state_path

DEFAULT_WORK_DIR = "work"


class BrokerError(RuntimeError):
    """The embedded broker could not be started, found or stopped."""


def resolve_bootstrap(settings: Mapping[str, str]) -> str:
    """`bootstrap.servers` if set, else the embedded broker's address from its state file."""
    configured = settings.get("bootstrap.servers", "").strip()
    if configured:
        return configured
    work_dir = settings.get("tailguard.work-dir", "") or DEFAULT_WORK_DIR
    state = read_state(work_dir)
    if state is None or not state.ours():
        raise BrokerError(
            f"no Kafka broker: bootstrap.servers is not set and no embedded broker is running "
            f"under {work_dir!r} (no live {state_path(work_dir)}). Start one with "
            f"`tailguard broker up` or set bootstrap.servers."
        )
    return state.bootstrap
