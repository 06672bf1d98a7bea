"""A slow node for I/O-bound work: a per-host factor that tasks on the host read.

Why not the SIGSTOP throttle (`tailguard.cluster.throttle`): pausing a worker's process tree
only removes capacity when there are no more executors than cores. With 6 executors on 2 cores
the paused node's CPU goes to the others, and a "5x slow" node cost plain PySpark ~1.26x
(design §7). Here a task's work is a wait, and the wait on a slow host is `factor` times longer:
it models I/O-bound work on a degraded host (a failing disk, a congested link), so many workers
fit on a few cores and the slow node really loses `1 - 1/factor` of its capacity.

How the factor reaches the task:
- `tailguard cluster` writes one small JSON file per slowed worker,
  `<cluster work dir>/slowness/<host>.json` =
  `{"factor": 5.0, "since": <epoch s>, "until": <epoch s or null>}`, atomically (write,
  then rename), and removes it to make the host healthy again.
- Each worker is started with `TAILGUARD_SLOWNESS_FILE` naming its file. Executors inherit the
  worker's environment and Python workers the executor's, as they inherit `SPARK_LOCAL_IP`, so
  a task finds its own host's file without knowing the cluster.
- A file rather than an environment value, because the environment of a running executor cannot
  change: the file can, so a host can be slowed or healed mid-job, and running tasks see it
  within one tick (`io_work` re-reads it every 100 ms). `until` makes a temporary slowness
  (`--for 30s`) expire, and `since` a later one (`--after 6s`: a node that turns slow mid-job)
  begin, without any process having to stay alive to do it.

Task side: `host_factor()` (1.0 when not on a slowed host, or outside such a cluster) and
`io_work(seconds)`, which does `seconds` of healthy-host work: it progresses at 1/factor of the
wall clock, re-reading the factor every tick, so a factor change mid-task applies to the rest
of the task only. It waits with the `wait` it is given (a plain sleep by default): tailguard's
own jobs pass `tailguard.agent.executor.control.wait`, which a cancelled attempt interrupts
(`bench/io_job.py`). The cluster sits below the agent, so the agent's wait comes as an argument.

Stdlib only: tasks import this module on the executors.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ENV_VAR = "TAILGUARD_SLOWNESS_FILE"
SLOWNESS_DIR = "slowness"
TICK_S = 0.1  # how often `io_work` re-reads the factor


@dataclass(frozen=True)
class Slowness:
    factor: float
    until: float | None  # wall-clock epoch seconds; None: until cleared
    # Wall-clock epoch seconds: when it starts (written: now, or `after_s` later); None in a
    # file from before `since` existed, which is slow from its write.
    since: float | None = None

    def factor_at(self, now: float) -> float:
        started = self.since is None or now >= self.since
        ended = self.until is not None and now >= self.until
        return self.factor if started and not ended else 1.0


def slowness_file(cluster_work_dir: Path, host: str) -> Path:
    return Path(cluster_work_dir) / SLOWNESS_DIR / f"{host}.json"


def write(
    path: Path,
    factor: float,
    duration_s: float | None = None,
    after_s: float | None = None,
    now: float | None = None,
) -> Slowness:
    """Slow the host whose file is `path` by `factor`: from `after_s` seconds on (None: now),
    for `duration_s` (None: until cleared)."""
    if not factor >= 1.0:
        raise ValueError(f"factor must be >= 1 (1 = not slowed), got {factor}")
    for name, value in (("duration_s", duration_s), ("after_s", after_s)):
        if value is not None and not value >= 0:
            raise ValueError(f"{name} must be >= 0 seconds, got {value}")
    since = (time.time() if now is None else now) + (after_s or 0.0)
    until = None if duration_s is None else since + duration_s
    slow = Slowness(float(factor), until, since)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"factor": slow.factor, "since": slow.since, "until": slow.until}))
    tmp.replace(path)  # a task never reads a half-written file
    return slow


def clear(path: Path) -> None:
    path.unlink(missing_ok=True)


def read(path: Path) -> Slowness | None:
    """The recorded slowness, or None (no file, or a file that does not parse)."""
    try:
        raw = json.loads(path.read_text())
        factor = float(raw["factor"])
        until = None if raw.get("until") is None else float(raw["until"])
        since = None if raw.get("since") is None else float(raw["since"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return Slowness(max(1.0, factor), until, since)


def factor_of(path: Path | None, now: float | None = None) -> float:
    if path is None:
        return 1.0
    slow = read(path)
    return 1.0 if slow is None else slow.factor_at(time.time() if now is None else now)


def host_factor() -> float:
    """This host's slowness factor for I/O-bound work (1.0: healthy or not on such a cluster)."""
    name = os.environ.get(ENV_VAR)
    return factor_of(Path(name) if name else None)


def io_work(
    seconds: float,
    *,
    factor: Callable[[], float] = host_factor,
    wait: Callable[[float], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    tick_s: float = TICK_S,
) -> float:
    """Do `seconds` of I/O-bound work as a healthy host would; returns the wall time taken.

    Progress runs at 1/factor of the wall clock and the factor is re-read every `tick_s`, so on
    a host slowed 5x the call takes 5x as long, and healing the host mid-call speeds up the
    rest. Measured progress (not the asked slice) is counted, so a late wake-up on a busy
    machine is not extra work. A cancellation raised by `wait` propagates.
    """
    if seconds < 0:
        raise ValueError(f"seconds must be >= 0, got {seconds}")
    pause = wait or time.sleep
    started = clock()
    left = float(seconds)  # healthy-host seconds still to do
    while left > 1e-6:
        f = max(1.0, factor())
        asked = min(tick_s, left * f)
        before = clock()
        pause(asked)
        left -= (clock() - before) / f
    return clock() - started
