"""The harness's watchdog: a process that outlives a killed pytest session and stops what the
session left running, the moment it ends.

The ledger (tailguard.testing.leftovers) lets the *next* session clean up after a killed one, but
there may be no next session: a cancelled CI job's machine keeps running, a developer's killed
run leaves a broker, a cluster and five services for hours. So the plugin starts one watchdog
per session that uses the harness:

- in a session of its own (a terminal's Ctrl-C or a CI runner's signal to the process group does
  not reach it), without the session's mark (tailguard.testing.leftovers.MARK_ENV: it is not
  one of the processes it stops);
- it waits for the session's exit on a pidfd (Linux 5.3+; psutil's wait elsewhere): an event,
  whatever ended the session, SIGKILL included;
- then, if the session's ledger is still there (a clean end deletes it), it stops what the
  ledger names and every process that carries the session's mark, with their trees, and
  deletes the ledger (`leftovers.reap_session`), logging each line to
  `<ledger dir>/watchdogs/<ledger>.log`.

A clean end costs nothing more: the watchdog finds no ledger and exits with the session.

    python -m tailguard.testing.watchdog LEDGER PID CREATED
"""

from __future__ import annotations

import os
import select
import sys
import time
from pathlib import Path

import psutil

from tailguard.processes import supervised
from tailguard.testing import leftovers


def start(ledger: leftovers.Ledger) -> int:
    """Start the watchdog of this session (the current process) and record it in the ledger;
    its pid."""
    me = psutil.Process()
    env = {k: v for k, v in os.environ.items() if k != leftovers.MARK_ENV}
    process = supervised.launch(
        [
            sys.executable,
            "-m",
            "tailguard.testing.watchdog",
            str(ledger.path),
            str(me.pid),
            repr(me.create_time()),
        ],
        log_path(ledger.path),
        env=env,
    )
    ledger.record_watchdog(process.pid)
    return process.pid


def log_path(ledger: Path) -> Path:
    """Where the watchdog of `ledger`'s session says what it stopped (kept only then)."""
    directory = ledger.parent / "watchdogs"
    directory.mkdir(exist_ok=True, mode=0o700)
    return directory / f"{ledger.stem}.log"


def await_exit(pid: int, created: float) -> None:
    """Return once the process `pid` that started at `created` has ended (at once if it has,
    or if the pid is someone else's now)."""
    try:
        process = psutil.Process(pid)
        if process.create_time() != created:
            return
    except psutil.NoSuchProcess:
        return
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd here: psutil polls
        process.wait()
        return
    try:
        # The pid was checked before the pidfd was opened: it may have been reused in between.
        if process.is_running():
            select.select([pidfd], [], [])  # readable once the process has exited
    finally:
        os.close(pidfd)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    ledger, pid, created = Path(args[0]), int(args[1]), float(args[2])
    await_exit(pid, created)

    def report(line: str) -> None:
        print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}", flush=True)

    stopped = leftovers.reap_session(ledger, report)
    if stopped:
        report(f"pytest session {pid} ended without its teardown: {len(stopped)} stopped")
    else:  # a clean end, or nothing left: no log to keep
        log_path(ledger).unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
