"""CPU budgets on this machine's real cgroup hierarchy (skipped without a writable one): a
group takes a quota in CPUs, holds the processes moved into it and their later children, and
goes away with its emptied parents, its members moved back to the root."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tailguard.cluster import cpu_budget

HIERARCHY = cpu_budget.hierarchy()
pytestmark = pytest.mark.skipif(HIERARCHY is None, reason="no writable cgroup CPU controller")


def test_a_worker_gets_its_cores_or_its_share_of_the_machine() -> None:
    assert cpu_budget.share_cores(workers=2, cores=1, cpus=2) == 1.0
    assert cpu_budget.share_cores(workers=3, cores=1, cpus=2) == pytest.approx(2 / 3)
    assert cpu_budget.share_cores(workers=6, cores=2, cpus=4) == pytest.approx(2 / 3)


@pytest.fixture
def budget(tmp_path: Path) -> Iterator[cpu_budget.CpuBudget]:
    assert HIERARCHY is not None
    made = HIERARCHY.group(cpu_budget.group_name(tmp_path, "127.0.0.9")).create()
    yield made
    made.remove()


def test_a_group_takes_a_quota_and_holds_a_process_and_its_children(
    budget: cpu_budget.CpuBudget,
) -> None:
    budget.set_cores(0.25)
    assert budget.cores() == pytest.approx(0.25)
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys; sys.stdin.read(); "
            "c = subprocess.Popen(['sleep', '30']); print(c.pid, flush=True); c.wait()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        budget.add(parent.pid)
        assert parent.stdin is not None and parent.stdout is not None
        parent.stdin.close()  # now it forks its child, inside the group
        child = int(parent.stdout.readline())
        assert {parent.pid, child} <= set(budget.pids())
        with pytest.raises(ValueError, match="positive number of cores"):
            budget.set_cores(0)
        budget.remove()
        assert not budget.path.exists()
        assert not budget.path.parent.exists()  # its cluster's group, empty, went too
        root = (HIERARCHY.root / "cgroup.procs").read_text().split()
        assert str(parent.pid) in root and str(child) in root
    finally:
        subprocess.run(["pkill", "-P", str(parent.pid)], check=False)
        parent.kill()
        parent.wait()


def test_a_pid_that_does_not_exist_is_a_clear_error(budget: cpu_budget.CpuBudget) -> None:
    with pytest.raises(cpu_budget.BudgetError, match="cannot move process"):
        budget.add(2**22 + 12345)
