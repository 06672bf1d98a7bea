"""Answering a service's input in batches (group commit): each input goes to the core at once, in
order, and its outputs to the producer at once, but the wait for the broker's acknowledgement of
the outputs, and the input's own acknowledgement, happen once per batch.

A batch ends when no further input is waiting in the stream (or at `BATCH_MAX_INPUTS`), so a lone
input is answered as soon as before, with no timer: under a burst the inputs that queued while a
batch's outputs were awaited make the next batch. The core sees exactly the input order it saw
one by one (as replay feeds it), so batching changes no decision, only how often the service
waits for the broker. faust's `Stream.take_events(max, within)` batches too, but holds a lone
input up to `within` and wakes every `within` while idle. Neither cuts faust's own work per
message, which is most of a service's CPU per event (docs/benchmarks.md, bench-load): faust
hands the stream one message at a time, and batches here are mostly of one input or two.

What a crash may lose stays as before: an input is acknowledged (and later committed) only after
all its batch's outputs are on the broker, and a snapshot is taken only between batches.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from tailguard.shell.processor import Outgoing, Processor
from tailguard.shell.snapshot import PeriodicSnapshots
from tailguard.shell.stop_report import FlushTracker

# Inputs in one batch at most: bounds what a crash has a restarted service process a second time
# and how long a batch keeps its inputs unacknowledged under a long burst.
BATCH_MAX_INPUTS = 500


class BatchedAnswers:
    """Feeds one input at a time (`answer`), and awaits its batch's outputs and acknowledges its
    inputs when the batch ends. `send` hands an output to the producer and returns what to await
    for the broker's acknowledgement; `ack` acknowledges an input (faust's manual ack)."""

    def __init__(
        self,
        processor: Processor,
        send: Callable[[Outgoing], Awaitable[Awaitable[Any]]],
        ack: Callable[[Any], Awaitable[Any]],
        flushed: FlushTracker,
        snapshots: PeriodicSnapshots | None = None,
        lag: Callable[[Any], int] | None = None,
        max_inputs: int = BATCH_MAX_INPUTS,
    ) -> None:
        if max_inputs < 1:
            raise ValueError(f"a batch holds at least one input, not {max_inputs}")
        self._processor = processor
        self._send = send
        self._ack = ack
        self._flushed = flushed
        self._snapshots = snapshots
        self._lag = lag
        self.max_inputs = max_inputs
        self._events: list[Any] = []
        self._pending: list[Awaitable[Any]] = []
        self._answered_ts: list[int] = []  # input event times (ms) of the inputs answered
        self.batches = 0  # batches ended, for tests and logs

    async def answer(self, event: Any, more_waiting: bool) -> None:
        """Feed `event` (a faust event: its message's value, partition, offset, key, headers) to
        the core and send its outputs; end the batch unless `more_waiting` says that further
        input is already waiting in the stream."""
        message = event.message
        if not self._events and self._snapshots is not None:
            self._snapshots.before_input()
        outputs = self._processor.process(
            event.value, message.partition, message.offset, message.key,
            received_headers(message.headers),
        )  # fmt: skip
        for out in outputs:
            # Sent at once, awaited at the batch's end, in the order the core made them.
            self._pending.append(await self._send(out))
        self._events.append(event)
        if outputs and outputs[0].input_ts is not None:
            self._answered_ts.append(outputs[0].input_ts)
        first = self._events[0].message
        self._flushed.outputs_sent(
            f"{message.topic}[{message.partition}]@{message.offset}"
            + (f" (batch from {first.partition}@{first.offset})" if first is not message else ""),
            len(self._pending),
        )
        if not more_waiting or len(self._events) >= self.max_inputs:
            await self.end_batch()

    async def end_batch(self) -> None:
        """Await the batch's outputs, then acknowledge its inputs: an input is committed only
        once everything the batch sent is on the broker, so a crash loses no decision."""
        if not self._events:
            return
        for pending in self._pending:
            await pending
            self._flushed.output_confirmed()
        now = time.time()
        for input_ts in self._answered_ts:
            self._processor.metrics.decision_sent(input_ts, now)
        for event in self._events:
            await self._ack(event)
            self._flushed.answered(event.message.partition, event.message.offset)
        if self._lag is not None:
            self._processor.metrics.lag.set(self._lag(self._events[-1].message))
        inputs = len(self._events)
        self._events, self._pending, self._answered_ts = [], [], []
        self.batches += 1
        if self._snapshots is not None:
            self._snapshots.after_input(inputs)


def received_headers(headers: Any) -> list[tuple[str, bytes | None]]:
    """A faust message's headers (a list of pairs or a mapping, by version) as pairs."""
    if not headers:
        return []
    pairs = headers.items() if hasattr(headers, "items") else headers
    return [(str(name), value) for name, value in pairs]
