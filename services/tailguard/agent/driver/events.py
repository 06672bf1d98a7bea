"""Event sequencing: every fact the driver records gets the job's next sequence number and id,
goes to the publisher, and is shown to the local cores and the caller's hook, in that order."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tailguard.agent.driver.fallbacks import LocalFallbacks
from tailguard.agent.driver.ports import Publisher
from tailguard.agent.driver.state import Attempt
from tailguard.model import records as r
from tailguard.model.ids import event_id


def now_ms() -> int:
    return int(time.time() * 1000)


class EventLog:
    def __init__(
        self,
        job_id: str,
        publisher: Publisher,
        fallbacks: LocalFallbacks,
        on_event: Callable[[r.Event], None] | None,
    ) -> None:
        self.job_id = job_id
        self.publisher = publisher
        self.fallbacks = fallbacks
        self._on_event = on_event
        # The last sequence number given (a recovered job goes on from its dead driver's).
        self.sequence = 0
        self.published = 0

    def emit(self, cls: type[r.Event], **fields: Any) -> r.Event:
        self.sequence += 1
        event = cls(
            job_id=self.job_id, ts=now_ms(), id=event_id(self.job_id, self.sequence), **fields
        )
        self.publisher.publish(event)
        self.published += 1
        # The local cores see exactly what the services see.
        self.fallbacks.observe(event)
        if self._on_event is not None:
            self._on_event(event)
        return event

    def attempt_event(self, cls: type[r.Event], attempt: Attempt, **fields: Any) -> r.Event:
        """An event about one attempt (they all name it the same way)."""
        return self.emit(
            cls,
            vertex=attempt.vertex,
            subtask=attempt.subtask,
            attempt=attempt.number,
            host=attempt.host,
            **fields,
        )
