"""One CLI: --version, the same verbs and exit statuses for broker, cluster and services, and
replay's exact exit status (0 no difference, 1 differences, 2 usage or input error)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from tests.unit.speculation_histories import SIMULATION_CONFIG
from tests.unit.test_replay import recorded_log, write_archive

import tailguard
from tailguard.cli import main
from tailguard.model import records as r
from tailguard.replay.engine import Recorded


def test_version() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tailguard.cli", "--version"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0
    assert done.stdout.strip() == f"tailguard {tailguard.__version__}"


@pytest.mark.parametrize("command", ["broker", "services", "cluster"])
def test_status_and_down_mean_the_same_for_every_part(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing running: `status` exits 1 and says so, `down` has nothing to do and exits 0."""
    work = str(tmp_path / "work")
    assert main([command, "status", "--work-dir", work]) == 1
    assert main([command, "down", "--work-dir", work]) == 0
    said = capsys.readouterr()
    assert "no " in (said.out + said.err).lower()


# --------------------------------------------------------------------------- replay


@pytest.fixture
def deployment(tmp_path: Path) -> str:
    config = tmp_path / "deployment.toml"
    config.write_text("".join(f'"{k}" = "{v}"\n' for k, v in SIMULATION_CONFIG.items()))
    return str(config)


@pytest.fixture
def archive(tmp_path: Path) -> str:
    path = tmp_path / "job.avro"
    write_archive(path, recorded_log())
    return str(path)


def test_replay_exits_0_when_every_decision_is_reproduced(
    deployment: str, archive: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--config", deployment, "replay", archive]) == 0
    assert "0 differences" in capsys.readouterr().out


def test_replay_exits_1_on_a_difference(tmp_path: Path, deployment: str) -> None:
    log = recorded_log()
    at = next(i for i, x in enumerate(log) if isinstance(x.record, r.LaunchSpeculativeAttempts))
    launch = log[at].record
    assert isinstance(launch, r.LaunchSpeculativeAttempts)
    log[at] = Recorded(r.COMMANDS_TOPIC, dataclasses.replace(launch, count=launch.count + 1))
    changed = tmp_path / "changed.avro"
    write_archive(changed, log)
    assert main(["--config", deployment, "replay", str(changed)]) == 1


def test_a_what_if_exits_1_when_decisions_would_differ_and_0_when_not(
    tmp_path: Path, deployment: str, archive: str, capsys: pytest.CaptureFixture[str]
) -> None:
    stricter = tmp_path / "stricter.toml"
    stricter.write_text('"slow-task-detector.execution-time.baseline-multiplier" = "100"\n')
    assert main(["--config", deployment, "replay", archive, "--what-if", str(stricter)]) == 1
    assert "would differ" in capsys.readouterr().out
    same = tmp_path / "same.toml"
    same.write_text('"decider.timeout" = "10 s"\n')  # the value in force: nothing changes
    assert main(["--config", deployment, "replay", archive, "--what-if", str(same)]) == 0


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["replay", "{archive}", "--config", "{what_if}"], "use --what-if FILE"),
        (["replay"], "give an ARCHIVE file or --topic"),
        (["replay", "{archive}", "--topic"], "give an ARCHIVE file or --topic"),
        (["replay", "{missing}"], "no archive at"),
        (["replay", "{archive}", "--job", "nobody"], "no events of job nobody"),
        (["replay", "{archive}", "--what-if", "{missing}.toml"], "missing.toml"),
    ],
)
def test_replay_exits_2_on_a_usage_or_input_error(
    tmp_path: Path,
    archive: str,
    argv: list[str],
    problem: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    what_if = tmp_path / "what-if.toml"
    what_if.write_text('"decider.timeout" = "2 s"\n')
    paths = {"archive": archive, "what_if": str(what_if), "missing": str(tmp_path / "missing")}
    assert main([a.format(**paths) for a in argv]) == 2
    said = capsys.readouterr()
    assert problem in said.err and not said.out.strip()


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["bench", "--scenarios", "io-slowest"], "unknown scenario(s) ['io-slowest']"),
        (["bench", "--runs", "0"], "--runs must be at least 1"),
        (["bench", "--task-seconds", "0"], "--task-seconds must be above 0"),
        (["cluster", "throttle", "127.0.0.2", "--factor", "0.5"], "factor must be >= 1"),
        (
            ["cluster", "throttle", "127.0.0.2", "--factor", "5", "--after", "6s"],
            "--after is for --mode io only",
        ),
    ],
)
def test_a_bad_request_is_named_and_exits_2_before_anything_starts(
    argv: list[str], problem: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main([*argv, "--work-dir", str(tmp_path)]) == 2
    assert problem in capsys.readouterr().err
