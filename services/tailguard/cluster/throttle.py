"""Make a node genuinely slow: pause and resume a worker's whole process tree in a duty cycle.

In every period of `period_ms` the tree runs for `period_ms / factor` and is stopped (SIGSTOP)
for the rest, so CPU-bound work there takes about `factor` times as long. Pauses are sized by
the time the tree really ran, so the duty cycle holds even when this process wakes late on a
busy machine. Work bounded by wall clock time (sleeps, timeouts) is not slowed. Throttling caps
the tree's CPU share; on a machine so loaded that the tree would get less than that share
anyway, the slow-down is smaller than `factor`.

The tree is re-discovered at every pause, because the executor JVM and its Python workers start
after the Worker and the daemon's workers leave the Worker's process group. Whatever happens
(stop, SIGTERM, an exception), every process this throttler paused is resumed before it exits.

An executor that starts while its node is throttled registers late with the driver, so throttle
a node only after its executor has registered; ordering is the caller's job.

Run detached, one per throttled worker, so it outlives the command that started it::

    python -m tailguard.cluster.throttle --pid WORKER_PID --factor 5 [--period-ms 100] [--for 30]
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType

from tailguard.model.config import parse_duration_ms
from tailguard.processes.trees import descendants, signal_all


class Throttler:
    """Duty-cycle SIGSTOP/SIGCONT of the process tree rooted at `pids_root`."""

    def __init__(
        self,
        pids_root: int,
        factor: float,
        period_ms: float = 100,
        duration_s: float | None = None,
    ) -> None:
        if factor < 1:
            raise ValueError(f"factor must be >= 1 (1 = not slowed), got {factor}")
        if period_ms <= 0:
            raise ValueError(f"period_ms must be > 0, got {period_ms}")
        self.pids_root = pids_root
        self.factor = factor
        self.period_s = period_ms / 1000.0
        self.duration_s = duration_s
        self._stop = threading.Event()
        self._paused: set[int] = set()

    def stop(self) -> None:
        """Ask the loop to end; it resumes everything before `run` returns."""
        self._stop.set()

    def run(self) -> None:
        """Throttle until `stop()`, the duration is over, or the root process is gone."""
        run_s = self.period_s / self.factor
        ends = None if self.duration_s is None else time.monotonic() + self.duration_s
        tree = descendants(self.pids_root)
        ran_s = paused_s = 0.0
        try:
            while tree and not self._stop.is_set():
                if ends is not None and time.monotonic() >= ends:
                    break
                resumed_at = time.monotonic()
                # The running slice: the Event doubles as an interruptible timer.
                if self._stop.wait(run_s) or self.factor == 1:
                    continue
                # Stop the known tree first and look for new descendants only then, so the
                # scan does not lengthen the running slice.
                signal_all(tree, signal.SIGSTOP)
                stopped_at = time.monotonic()
                self._paused.update(tree)
                tree = descendants(self.pids_root)
                signal_all([p for p in tree if p not in self._paused], signal.SIGSTOP)
                self._paused.update(tree)
                # Size pauses by the time the tree actually ran and was paused so far: on a
                # loaded machine this process wakes late, so fixed slices would drift from
                # the duty cycle (running longer or pausing longer than asked).
                ran_s += stopped_at - resumed_at
                pause_s = ran_s * (self.factor - 1) - paused_s
                self._stop.wait(max(0.0, stopped_at + pause_s - time.monotonic()))
                self._resume()
                paused_s += time.monotonic() - stopped_at
        finally:
            self._resume()

    def _resume(self) -> None:
        # Also resume anything that appeared in the tree meanwhile, in case it got stopped
        # through a group-wide signal.
        paused = self._paused | set(descendants(self.pids_root))
        signal_all(sorted(paused), signal.SIGCONT)
        self._paused.clear()


def parse_duration(text: str) -> float:
    """'30', '30s', '2m', '500ms' -> seconds: the settings' parser (`model/config.py`) with the
    units it knows, except that a bare number here is seconds, as `--for` always read it."""
    return parse_duration_ms(text, bare_unit="s") / 1000


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tailguard.cluster.throttle")
    parser.add_argument("--pid", type=int, required=True, help="root of the tree to throttle")
    parser.add_argument("--factor", type=float, required=True, help="slow-down factor (>= 1)")
    parser.add_argument("--period-ms", type=float, default=100.0)
    parser.add_argument("--for", dest="duration", type=parse_duration, default=None)
    args = parser.parse_args(argv)
    throttler = Throttler(args.pid, args.factor, args.period_ms, args.duration)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        throttler.stop()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    throttler.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
