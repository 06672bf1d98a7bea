"""Assertions about a `JobRun` whose failure messages say what happened instead.

- `assert_succeeded(run)`: the job succeeded (else its summary and every failed attempt).
- `assert_output_equals(run, reference, ignore_order=...)`: the committed output equals a pandas
  or Arrow reference (else the rows that differ, as tables).
- `assert_speculated(run, "score", subtask=2)` / `assert_not_speculated(...)`: a speculative
  attempt ran (else which did, and what the detector found) / none did (else which did).
- `assert_blocked(run, "127.0.0.4")` / `assert_not_blocked(...)`.
- `assert_replay_clean(run)`: the replay engine reproduces every decision in the archive.

`vertex` may name an operator (`"score"`) or a chain (`"sales→score→partial"`): attempts run
per chain, and an operator's attempts are those of its chain.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from tailguard.testing.jobrun import JobRun, chains_of
from tailguard.testing.tables import as_table, compare_tables

if TYPE_CHECKING:
    from tailguard.agent.driver.result import AttemptSummary
    from tailguard.replay.engine import ReplayReport

SHOW = 10


def _attempt(a: AttemptSummary) -> str:
    outcome = a.status + (" (won)" if a.won else "")
    if a.cancel_reason:
        outcome += f" ({a.cancel_reason})"
    if a.error:
        outcome += f": {a.error.splitlines()[0][:200]}"
    kind = "speculative attempt" if a.speculative else "attempt"
    return f"{a.vertex}#{a.subtask} {kind} {a.attempt} on {a.host}: {outcome}"


def _listed(items: Iterable[str], empty: str = "none") -> str:
    lines = list(items)
    if not lines:
        return f" {empty}"
    more = [f"    ... and {len(lines) - SHOW} more"] if len(lines) > SHOW else []
    return "\n" + "\n".join([*(f"    {line}" for line in lines[:SHOW]), *more])


def _target(run: JobRun, vertex: str | None, subtask: int | None) -> tuple[set[str] | None, str]:
    """The chains `vertex` ran in (None: any), and how to name the target in a message."""
    if vertex is None:
        return None, "any subtask" if subtask is None else f"subtask {subtask} of any vertex"
    chains = chains_of(run.result, vertex)
    name = vertex if subtask is None else f"{vertex}#{subtask}"
    if chains != [vertex]:
        name += f" (chain {', '.join(chains)})"
    return set(chains), name


def _matches(a: AttemptSummary, chains: set[str] | None, subtask: int | None) -> bool:
    return (chains is None or a.vertex in chains) and (subtask is None or a.subtask == subtask)


def _times_by_host(attempts: Iterable[AttemptSummary]) -> list[str]:
    """Per host, how many of the attempts ran there and how long they took."""
    times: dict[str, list[int]] = {}
    for a in attempts:
        if a.status == "FINISHED":
            times.setdefault(a.host, []).append(a.duration_ms)
    return [
        f"{host}: {len(ms)} finished, {min(ms) / 1000:.1f}-{max(ms) / 1000:.1f} s"
        for host, ms in sorted(times.items())
    ]


def _slow_findings(run: JobRun) -> list[str]:
    from tailguard.model import records as r

    if run.result.archive is None:
        return []
    seen: dict[tuple[str, int, str], int] = {}
    for finding in run.of(r.SlowTasksDetected):
        for slow in finding.slow:
            for attempt in slow.live_attempts:
                if attempt.slow:
                    key = (finding.vertex, slow.subtask, attempt.host)
                    seen[key] = max(seen.get(key, 0), attempt.execution_time_ms)
    return [f"{v}#{s} on {h} (ran {ms / 1000:.1f} s)" for (v, s, h), ms in seen.items()]


def _rejected(run: JobRun, command_type: str) -> list[str]:
    return [
        f"{cid}: {reason}"
        for cid, ctype, reason in run.result.commands_rejected
        if ctype == command_type
    ]


def assert_succeeded(run: JobRun) -> None:
    if run.ok:
        return
    failed = [a for a in run.result.attempts if a.status == "FAILED"]
    raise AssertionError(
        f"the job did not succeed:\n{run.summary()}\nfailed attempts:"
        + _listed(_attempt(a) for a in failed)
    )


def assert_output_equals(
    actual: Any,
    expected: Any,
    *,
    sink: str | None = None,
    ignore_order: bool = False,
    check_types: bool = True,
    rel_tol: float = 0.0,
) -> None:
    """The output (a `JobRun`'s committed sink, or a table) equals `expected` (a pandas
    DataFrame or an Arrow table). Column order never matters; row order only without
    `ignore_order`. Values are exact unless `rel_tol` allows floats to differ."""
    if isinstance(actual, JobRun):
        actual = actual.output(sink)
    diff = compare_tables(
        as_table(actual, "output"),
        as_table(expected, "reference"),
        ignore_order=ignore_order,
        check_types=check_types,
        rel_tol=rel_tol,
    )
    if not diff.equal:
        raise AssertionError(diff.message("the output differs from the reference:"))


def assert_speculated(
    run: JobRun, vertex: str | None = None, subtask: int | None = None, *, won: bool | None = None
) -> list[AttemptSummary]:
    """A speculative attempt ran for `vertex` (`subtask`), and, with `won=True`, one of them
    finished first (`won=False`: none did). Returns those attempts."""
    chains, name = _target(run, vertex, subtask)
    speculative = [a for a in run.result.attempts if a.speculative]
    matching = [a for a in speculative if _matches(a, chains, subtask)]
    winners = [a for a in matching if a.won]
    if matching and (won is None or bool(winners) == won):
        return matching
    if matching:
        expected = "one of them to win" if won else "none of them to win"
        raise AssertionError(
            f"speculative attempts of {name} ran, but expected {expected}:"
            + _listed(_attempt(a) for a in matching)
        )
    targets = [a for a in run.result.attempts if _matches(a, chains, subtask)]
    raise AssertionError(
        f"no speculative attempt of {name} ran.\nspeculative attempts that did run:"
        + _listed(_attempt(a) for a in speculative)
        + f"\nattempts of {name} by host:"
        + _listed(_times_by_host(targets))
        + "\nslow tasks the detector reported:"
        + _listed(_slow_findings(run), "none (no finding in the archive: were services on?)")
        + "\nspeculation commands rejected:"
        + _listed(_rejected(run, "LaunchSpeculativeAttempts"))
    )


def assert_not_speculated(
    run: JobRun, vertex: str | None = None, subtask: int | None = None
) -> None:
    chains, name = _target(run, vertex, subtask)
    matching = [a for a in run.result.attempts if a.speculative and _matches(a, chains, subtask)]
    if matching:
        raise AssertionError(
            f"expected no speculative attempt of {name}, but these ran:"
            + _listed(_attempt(a) for a in matching)
        )


def _blocks(run: JobRun) -> list[str]:
    return [
        f"{host} for {(until - start) / 1000:.1f} s" for host, start, until in run.result.blocked
    ]


def assert_blocked(run: JobRun, host: str) -> list[tuple[str, int, int]]:
    """`host` was blocked at least once during the run; its blocks (host, from ms, until ms)."""
    blocks = [b for b in run.result.blocked if b[0] == host]
    if blocks:
        return blocks
    raise AssertionError(
        f"{host} was never blocked.\nhosts that were blocked:"
        + _listed(_blocks(run))
        + "\nattempts by host:"
        + _listed(_times_by_host(run.result.attempts))
        + "\nslow tasks the detector reported:"
        + _listed(_slow_findings(run), "none (no finding in the archive: were services on?)")
        + "\nblock commands rejected:"
        + _listed(_rejected(run, "BlockNodes"))
    )


def assert_not_blocked(run: JobRun, host: str | None = None) -> None:
    """`host` (None: any host) was never blocked."""
    blocks = [b for b in run.result.blocked if host is None or b[0] == host]
    if blocks:
        which = "every host" if host is None else host
        raise AssertionError(
            f"expected {which} to stay unblocked, but the run blocked:"
            + _listed(f"{h} for {(until - start) / 1000:.1f} s" for h, start, until in blocks)
        )


def assert_replay_clean(run: JobRun) -> ReplayReport:
    """Replaying the run's archive with its settings reproduces every recorded decision (0
    differences). Returns the report (per service: compared, reproduced)."""
    from tailguard.replay.engine import replay

    report = replay(run.recorded, run.settings)
    if report.differences == 0:
        return report
    lines = [s.line() for s in report.services]
    for service in report.services:
        lines += [f"  {service.service} {d.describe()}" for d in service.differences[:SHOW]]
    lines += report.notes(SHOW)
    raise AssertionError(
        f"replay of {run.archive} has {report.differences} difference(s):" + _listed(lines)
    )
