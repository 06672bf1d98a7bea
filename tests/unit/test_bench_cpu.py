"""bench/cpu.py on real processes: a part's CPU is its processes' own and that of the children
they reaped; a process outside every part's trees is not counted."""

from __future__ import annotations

import subprocess
import sys

from tailguard.bench import cpu
from tailguard.bench.report import CPU_PARTS

# On a line from stdin, burns 0.5 CPU seconds in a grandchild it waits for (so reaps), says so,
# then waits for stdin to close.
_CHILD = """
import subprocess, sys
burn = "import time\\nend = time.process_time() + 0.5\\nwhile time.process_time() < end: pass"
sys.stdin.readline()
subprocess.run([sys.executable, "-c", burn], check=True)
print("burnt", flush=True)
sys.stdin.read()
"""


def _spawn() -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


def test_a_parts_cpu_counts_its_reaped_children_and_nothing_outside_it() -> None:
    inside, outside = _spawn(), _spawn()
    try:
        roots = cpu.CpuRoots(control_plane={"inside": inside.pid}, executors=(), driver=())
        before = roots.sample()
        for proc in (inside, outside):
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        for proc in (inside, outside):
            assert proc.stdout is not None and proc.stdout.readline() == "burnt\n"
        used = cpu.used(before, roots.sample())
    finally:
        for proc in (inside, outside):
            proc.communicate("")
    assert set(used) == {*CPU_PARTS, "control_plane.inside"}
    # The grandchild's 0.5 s (and its interpreter's start) counts; `outside`'s does not.
    assert 0.45 <= used["control_plane"] <= 1.2, used
    assert used["control_plane.inside"] == used["control_plane"]
    assert used["executors"] == used["driver"] == 0.0
