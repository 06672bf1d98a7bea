"""Record ids.

Decision ids are derived, never random: a service that restarts and processes the same input
again emits the same ids, and the agent applies each id at most once. Event ids are the job id
and the event's sequence number in that job, which is unique because the agent is the single
writer of a job's events.
"""

from __future__ import annotations

import hashlib


def derived_id(service: str, *parts: object) -> str:
    """A deterministic id for a decision of `service` caused by `parts` (ids, names, numbers)."""
    digest = hashlib.blake2b(digest_size=12)
    digest.update(service.encode())
    for part in parts:
        digest.update(b"\x1f")
        digest.update(str(part).encode())
    return f"{service}-{digest.hexdigest()}"


def event_id(job_id: str, sequence: int) -> str:
    return f"{job_id}-e{sequence}"
