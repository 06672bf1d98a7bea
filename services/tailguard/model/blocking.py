"""How much of a job's cluster may be blocked: `blocklist.max-blocked-fraction`, stated once.

The blocklist decides within it (per job and for the fleet), and every actuator checks a
`BlockNodes` against it before applying one: the owned driver (agent/driver/commands.py, and
the fleet list a job reads as it starts, agent/fleet_blocks.py), attach mode
(observer/command_guards.py), and replay's check of fleet commands. It lives here, under all of
them, so that an actuator depends on the rule and not on the blocklist service's package. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable


def max_blocked_hosts(registered: int, fraction: float) -> int:
    """How many of `registered` hosts may be blocked at once: ⌊fraction × registered⌋, and
    never all of them."""
    return max(0, min(math.floor(fraction * registered), registered - 1))


def blocked_fraction_problem(
    blocked: Iterable[str], adding: Iterable[str], hosts: Collection[str], fraction: float
) -> str | None:
    """Why blocking `adding` on top of `blocked` would block too many of the registered
    `hosts` (`blocklist.max-blocked-fraction`), or None if it would not.

    Only registered hosts count: a block kept on a host that left the cluster takes no share.
    """
    registered = set(hosts)
    after = (set(blocked) | set(adding)) & registered
    limit = max_blocked_hosts(len(registered), fraction)
    if len(after) > limit:
        return (
            f"blocking {sorted(set(adding))} would block {len(after)} of {len(registered)}"
            f" hosts, over blocklist.max-blocked-fraction {fraction:g} (at most {limit})"
        )
    return None
