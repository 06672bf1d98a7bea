"""Holding a job until its agent has received given commands: for tests that publish commands
from the driver's own thread (a `JobHooks.on_start`/`on_event` hook) and must see them handled
mid-job, not raced by the job's end."""

from __future__ import annotations

from collections.abc import Iterable

from tailguard.agent.driver.driver import JobDriver
from tailguard.agent.driver.ports import CommandReceived


def wait_until_received(
    driver: JobDriver, command_ids: Iterable[str], timeout_s: float = 60
) -> None:
    """Return once the agent's command reader has handed every one of `command_ids` to the
    driver's inbox. Called on the driver's thread, which is then not taking from the inbox: they
    stay queued, and the driver handles them right after the hook returns."""
    wanted = set(command_ids)
    inbox = driver.inbox

    def arrived() -> bool:
        waiting = {m.command.id for m in inbox.queue if isinstance(m, CommandReceived)}
        return wanted <= waiting

    # `put` notifies `not_empty`, under the queue's own lock: woken by each arrival, no sleep.
    with inbox.not_empty:
        assert inbox.not_empty.wait_for(arrived, timeout_s), (
            f"the agent did not receive {sorted(wanted)} within {timeout_s:g} s"
        )
