"""A service answering its input in batches (shell.answering) decides exactly what it decides one
input at a time, which is what replay does: the same outputs in the same order, for every service,
wherever the batches end. And it acknowledges an input only once every output its batch sent is
confirmed, ends a batch when no input is waiting, and never holds more than its cap."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

import pytest
from test_snapshot import CODEC, SETTINGS, three_jobs

from tailguard.shell.answering import BatchedAnswers
from tailguard.shell.processor import Outgoing, Processor
from tailguard.shell.snapshot import PeriodicSnapshots, SnapshotStore
from tailguard.shell.stop_report import FlushTracker
from tailguard.system.services import SERVICE_NAMES, service_named


@dataclass(frozen=True)
class Message:
    topic: str
    partition: int
    offset: int
    value: bytes
    key: bytes | None = None
    headers: Any = None


@dataclass(frozen=True)
class Event:
    message: Message

    @property
    def value(self) -> bytes:
        return self.message.value


@dataclass
class FakeBroker:
    """Records, in order, each output sent, each output confirmed and each input acknowledged."""

    sent: list[Outgoing] = field(default_factory=list)
    log: list[tuple[str, int]] = field(default_factory=list)

    async def send(self, out: Outgoing) -> Awaitable[None]:
        index = len(self.sent)
        self.sent.append(out)
        self.log.append(("sent", index))

        async def confirmed() -> None:
            self.log.append(("confirmed", index))

        return confirmed()

    async def ack(self, event: Event) -> None:
        self.log.append(("acked", event.message.offset))


def one_by_one(service: str, inputs: list[bytes]) -> list[tuple[str, bytes, bytes | None]]:
    processor = Processor(service_named(service), SETTINGS, CODEC)
    return [
        (out.topic, out.key, out.value)
        for offset, raw in enumerate(inputs)
        for out in processor.process(raw, 0, offset)
    ]


def batched(
    service: str, inputs: list[bytes], waiting: list[bool], max_inputs: int
) -> tuple[FakeBroker, BatchedAnswers]:
    definition = service_named(service)
    broker = FakeBroker()
    answers = BatchedAnswers(
        Processor(definition, SETTINGS, CODEC),
        broker.send,
        broker.ack,
        FlushTracker(),
        max_inputs=max_inputs,
    )

    async def run() -> None:
        for offset, raw in enumerate(inputs):
            event = Event(Message(definition.input_topic, 0, offset, raw))
            await answers.answer(event, more_waiting=waiting[offset])

    asyncio.run(run())
    return broker, answers


@pytest.mark.parametrize("service", SERVICE_NAMES)
@pytest.mark.parametrize("seed", [1, 2])
def test_batches_decide_as_one_by_one(service: str, seed: int) -> None:
    inputs = three_jobs(service_named(service).input_topic)
    expected = one_by_one(service, inputs)
    assert expected, f"the demo's input makes {service} decide nothing: nothing to compare"
    draw = random.Random(seed)
    # Bursts of input of random length, the last input with nothing behind it.
    waiting = [draw.random() < 0.9 for _ in inputs[:-1]] + [False]
    broker, answers = batched(service, inputs, waiting, max_inputs=draw.choice([7, 50, 500]))
    assert [(o.topic, o.key, o.value) for o in broker.sent] == expected
    assert 1 < answers.batches < len(inputs)


def test_an_input_is_acknowledged_after_its_batch_is_confirmed() -> None:
    inputs = three_jobs(service_named("detector").input_topic)
    waiting = [offset % 40 != 39 for offset in range(len(inputs) - 1)] + [False]
    broker, answers = batched("detector", inputs, waiting, max_inputs=25)
    confirmed: set[int] = set()
    sent = acked = 0
    for what, at in broker.log:
        if what == "sent":
            sent += 1
        elif what == "confirmed":
            confirmed.add(at)
        else:
            # Everything sent before this ack is on the broker already, this input's outputs too.
            assert confirmed == set(range(sent)), f"input {at} acknowledged before its outputs"
            assert at == acked, "inputs acknowledged out of order"
            acked += 1
    assert acked == len(inputs) and len(confirmed) == len(broker.sent) > 0
    # A batch ends at each input with nothing behind it and at the cap of 25: 40 = 25 + 15.
    groups, rest = divmod(len(inputs), 40)
    assert answers.batches == 2 * groups + (rest + 24) // 25


def test_a_lone_input_is_answered_at_once(tmp_path: Any) -> None:
    definition = service_named("detector")
    inputs = three_jobs(definition.input_topic)[:3]
    broker = FakeBroker()
    snapshots = PeriodicSnapshots(
        SnapshotStore(tmp_path / "s.avro"), lambda: pytest.fail("no snapshot is due")
    )
    answers = BatchedAnswers(
        Processor(definition, SETTINGS, CODEC), broker.send, broker.ack, FlushTracker(), snapshots
    )

    async def run() -> None:
        await answers.answer(Event(Message(definition.input_topic, 0, 0, inputs[0])), True)
        assert ("acked", 0) not in broker.log and snapshots.answering
        await answers.answer(Event(Message(definition.input_topic, 0, 1, inputs[1])), False)
        assert broker.log[-2:] == [("acked", 0), ("acked", 1)] and not snapshots.answering
        await answers.answer(Event(Message(definition.input_topic, 0, 2, inputs[2])), False)
        assert broker.log[-1] == ("acked", 2)

    asyncio.run(run())
    assert answers.batches == 2


def test_a_batch_holds_at_least_one_input() -> None:
    broker = FakeBroker()
    processor = Processor(service_named("detector"), SETTINGS, CODEC)
    with pytest.raises(ValueError, match="at least one input"):
        BatchedAnswers(processor, broker.send, broker.ack, FlushTracker(), max_inputs=0)
