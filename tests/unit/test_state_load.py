"""StateLoad: a service's state load runs beside its stream's start (tailguard.shell.worker)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from tailguard.shell.snapshot import PeriodicSnapshots, Snapshot, SnapshotStore
from tailguard.shell.worker import StateLoad


def _never_taken() -> Snapshot:
    raise AssertionError("no snapshot is taken here")


def test_the_stream_waits_for_the_load_and_gets_its_snapshots(tmp_path: Path) -> None:
    release = threading.Event()
    store = SnapshotStore(tmp_path / "snapshot.avro")
    made: list[PeriodicSnapshots] = []

    def load() -> PeriodicSnapshots:
        release.wait(10)  # the load is slower than the stream's start
        made.append(PeriodicSnapshots(store, _never_taken))
        return made[0]

    failures: list[BaseException] = []
    state_load = StateLoad(load, failures.append)

    async def stream() -> tuple[bool, PeriodicSnapshots]:
        waiting = asyncio.ensure_future(state_load.wait())
        await asyncio.sleep(0.05)
        early = waiting.done()
        release.set()
        return early, await waiting

    state_load.start()
    assert state_load.loaded() is None  # still loading
    early, got = asyncio.run(stream())
    assert not early, "the stream got the state before its load was done"
    assert got is made[0] and state_load.loaded() is made[0]
    assert failures == []


def test_a_failed_load_ends_the_service_and_never_hands_a_state_over() -> None:
    failed = threading.Event()
    failures: list[BaseException] = []

    def load() -> PeriodicSnapshots:
        raise RuntimeError("broker unreachable")

    def on_failure(err: BaseException) -> None:
        failures.append(err)
        failed.set()

    state_load = StateLoad(load, on_failure)
    state_load.start()
    assert failed.wait(10)
    assert [str(err) for err in failures] == ["broker unreachable"]
    assert state_load.loaded() is None
    with pytest.raises(RuntimeError, match="broker unreachable"):
        asyncio.run(state_load.wait())
