"""The fleet blocklist: one view of slow hosts across every job, as a pure core.

A host that is slow for one job is slow for the next, so evidence from any job counts against
it. This core wraps the per-job `BlocklistTracker` (each job still gets exactly the blocks its
own evidence earns, with the per-job rules of `policy.py`) and adds the fleet view:

- **Evidence across jobs.** The rule of `policy.py` (`blocklist.min-slow-attempts` distinct
  slow subtasks on the host; a subtask slow on two hosts at once blames the task, not a host)
  applied to the slow subtasks of every job together: two jobs with one slow subtask each on a
  host block it where one job alone would not. The fleet remembers evidence for the longer of
  `blocklist.evidence-window` and the block duration, not the window alone: the window says
  how long a *running* job's evidence stays fresh without being reported again, but a job that
  ended stops reporting, and jobs run one after another are further apart than the window
  (167-258 s in `make bench-fleet` against 2 min: with the window alone the slow host never
  reached the list). A piece of evidence counts as long as a block it earned would last.
- **One expiry.** A fleet block lasts until its last evidence's time plus
  `execution.batch.speculative.block-slow-node-duration`, however many jobs it affects; new
  evidence extends it (again only once the extension reaches half the duration, as the
  detector repeats its findings every Tick).
- **Every job that has the host** (any job seen in the findings within the block duration
  whose registered hosts include it) gets one `BlockNodes` with the fleet's expiry, unless it
  holds that block already; the per-job cap `blocklist.max-blocked-fraction` of *that job's*
  hosts holds (`blocked_fraction_problem`), and the fleet itself never blocks more than that
  fraction of all hosts it knows.
- **The published view** (`publish_view`): each change is a `FleetBlock` for the compacted
  topic `tailguard.blocklist`, a tombstone when the block's time is up. A job that starts reads
  that topic (`tailguard.agent.fleet_blocks`).

The view is a pure function of the findings in their order: time is the findings' `ts`, and the
output ids are derived from the causing finding, the job and the hosts. What no later decision
can read is forgotten on that time (`policy.forget_after_ms`, swept at most once per half of it):
evidence older than that, and jobs silent that long, so the state (and the service's snapshot of
it, `export_state`) follows the recent window and the running jobs, not the cluster's history.
Fleet blocks do not end early when evidence goes stale (the per-job rule does, for the job it
concerns): the jobs that gave the evidence may simply have ended, which says nothing about the
host.

Findings from any producer count (the detector on tailguard's own jobs, observe mode on plain
PySpark jobs): the core reads `SlowTasksDetected` records, whoever wrote them.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tailguard.blocklist.policy import (
    MAX_TRACKED_JOBS,
    BlocklistTracker,
    BlockRule,
    Forgetting,
    found_slow,
    host_evidence,
)
from tailguard.model.blocking import blocked_fraction_problem, max_blocked_hosts
from tailguard.model.config import Settings
from tailguard.model.fleet import FLEET_CAUSE_PREFIX, FleetBlock
from tailguard.model.ids import derived_id
from tailguard.model.records import BlockNodes, Record, SlowTasksDetected, UnblockNodes

__all__ = ["FleetBlocklist", "fleet_block_command"]

# Bumped on any change of what export_state writes; import_state refuses other versions.
STATE_VERSION = 1


@dataclass(frozen=True, slots=True)
class _Evidence:
    """One slow subtask of one job on a host."""

    job_id: str
    vertex: str
    subtask: int


@dataclass
class _Block:
    until_ts: int
    # Finding ids behind the block, oldest first (at most one per piece of evidence).
    evidence: tuple[str, ...]
    jobs: int


@dataclass
class _JobSeen:
    hosts: frozenset[str] = frozenset()
    last_ts: int = 0
    # host -> until ts of the block this job was last sent (by its own tracker or the fleet).
    holds: dict[str, int] = field(default_factory=dict)

    def held(self, now: int) -> set[str]:
        return {h for h, until in self.holds.items() if until > now}


class FleetBlocklist:
    SERVICE: ClassVar[str] = BlocklistTracker.SERVICE

    def __init__(
        self,
        settings: Settings,
        publish_view: bool = False,
        max_tracked_jobs: int = MAX_TRACKED_JOBS,
        forget_after: int | None = None,
    ) -> None:
        """`forget_after` (ms) overrides `policy.forget_after_ms`, as in `BlocklistTracker`."""
        self.settings = settings
        self._rule = BlockRule.from_settings(settings)
        # How long a slow subtask counts against its host (see "Evidence across jobs").
        self._memory_ms = max(self._rule.window_ms, self._rule.duration_ms)
        self._per_job = BlocklistTracker(settings, max_tracked_jobs, forget_after)
        self._forgetting = Forgetting.of(self._rule, forget_after)
        self._publish_view = publish_view
        self._max_jobs = max_tracked_jobs
        # host -> evidence -> (ts last seen slow, finding id that last reported it)
        self._evidence: dict[str, dict[_Evidence, tuple[int, str]]] = {}
        self._blocks: dict[str, _Block] = {}
        self._jobs: OrderedDict[str, _JobSeen] = OrderedDict()
        self._fleet_blocks = 0
        self._jobs_told = 0
        self._refused_by_job_cap = 0

    @classmethod
    def publishing(cls, settings: Settings) -> FleetBlocklist:
        """The service's core: also emits the view's changes for `tailguard.blocklist`."""
        return cls(settings, publish_view=True)

    def metrics(self) -> dict[str, float]:
        return {
            **self._per_job.metrics(),
            "fleetBlockedHosts": float(len(self._blocks)),
            "fleetBlocks": float(self._fleet_blocks),
            "fleetBlocksSentToJobs": float(self._jobs_told),
            "fleetBlocksRefusedByJobCap": float(self._refused_by_job_cap),
        }

    def view(self) -> dict[str, tuple[int, tuple[str, ...]]]:
        """host -> (until ts, evidence ids) of the fleet blocks held now."""
        return {h: (b.until_ts, b.evidence) for h, b in sorted(self._blocks.items())}

    def handle(self, record: Record) -> list[Record]:
        if not isinstance(record, SlowTasksDetected):
            return self._per_job.handle(record)  # a job's own settings (`FindingSettings`)
        self._forget(record.ts)
        out = self._per_job.handle(record)
        job = self._seen(record)
        for command in out:
            if isinstance(command, BlockNodes):
                job.holds.update(dict.fromkeys(command.hosts, command.until_ts))
            elif isinstance(command, UnblockNodes):
                for host in command.hosts:
                    job.holds.pop(host, None)
        expired = self._expire(record)
        if self._publish_view:  # tombstones are the view's changes too: not for a replay
            out.extend(expired)
        changed = self._update_blocks(record, self._record_evidence(record))
        out.extend(self._tell_jobs(record, changed))
        return out

    # ------------------------------------------------------------------ forgetting, state

    def _forget(self, now: int) -> None:
        """Drop evidence and jobs no decision can read any more (`policy.forget_after_ms`).
        Evidence is otherwise pruned only for a host found slow again, so a host slow once and
        never again kept its evidence for good; a job seen once stayed until 1,024 later ones.
        Blocks are not swept: each ends with a tombstone at the first finding after its time."""
        horizon = self._forgetting.horizon(now)
        if horizon is None:
            return
        for host, seen in list(self._evidence.items()):
            for key in [k for k, (ts, _) in seen.items() if ts < horizon]:
                del seen[key]
            if not seen:
                del self._evidence[host]
        for job_id in [j for j, job in self._jobs.items() if job.last_ts < horizon]:
            del self._jobs[job_id]

    def held(self) -> dict[str, int]:
        """How much state is held: what must not grow with the findings' history."""
        return {
            "jobs": len(self._jobs),
            "jobsWithBlocksOrEvidence": self._per_job.jobs_held,
            "evidence": sum(len(seen) for seen in self._evidence.values()),
            "fleetBlocks": len(self._blocks),
        }

    def export_state(self) -> bytes:
        """The whole state, encoded (JSON): the blocklist service's snapshot. A later decision
        of a core given it by `import_state` is the one this core would make."""
        state = {
            "version": STATE_VERSION,
            "per_job": self._per_job.state(),
            "evidence": [
                [host, [[e.job_id, e.vertex, e.subtask, ts, fid] for e, (ts, fid) in seen.items()]]
                for host, seen in self._evidence.items()
            ],
            "blocks": [
                [host, b.until_ts, list(b.evidence), b.jobs] for host, b in self._blocks.items()
            ],
            "jobs": [
                [job_id, sorted(job.hosts), job.last_ts, sorted(job.holds.items())]
                for job_id, job in self._jobs.items()
            ],
            "next_sweep": self._forgetting.next_sweep,
            "counts": [self._fleet_blocks, self._jobs_told, self._refused_by_job_cap],
        }
        return json.dumps(state, separators=(",", ":")).encode()

    def import_state(self, encoded: bytes) -> None:
        """Take over a state `export_state` wrote; ValueError naming the problem if it is not
        one (this core is then unchanged)."""
        try:
            state = json.loads(encoded)
            if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
                found = state.get("version") if isinstance(state, dict) else type(state).__name__
                raise ValueError(f"version {found!r}, this release reads {STATE_VERSION}")
            loaded = FleetBlocklist(
                self.settings, self._publish_view, self._max_jobs, self._forgetting.after_ms
            )
            loaded._load(state)
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"not a blocklist state: {err}") from err
        self.__dict__.update(loaded.__dict__)

    def _load(self, state: dict[str, Any]) -> None:
        self._per_job.load_state(state["per_job"])
        self._evidence = {
            str(host): {
                _Evidence(str(job), str(vertex), int(subtask)): (int(ts), str(fid))
                for job, vertex, subtask, ts, fid in seen
            }
            for host, seen in state["evidence"]
        }
        self._blocks = {
            str(host): _Block(int(until), tuple(str(i) for i in evidence), int(jobs))
            for host, until, evidence, jobs in state["blocks"]
        }
        self._jobs = OrderedDict(
            (
                str(job_id),
                _JobSeen(
                    frozenset(str(h) for h in hosts),
                    int(last_ts),
                    {str(h): int(until) for h, until in holds},
                ),
            )
            for job_id, hosts, last_ts, holds in state["jobs"]
        )
        sweep = state["next_sweep"]
        self._forgetting.next_sweep = None if sweep is None else int(sweep)
        self._fleet_blocks, self._jobs_told, self._refused_by_job_cap = (
            int(n) for n in state["counts"]
        )

    # ------------------------------------------------------------------ the view

    def _seen(self, finding: SlowTasksDetected) -> _JobSeen:
        job = self._jobs.pop(finding.job_id, None) or _JobSeen()
        job.hosts = frozenset(finding.hosts)
        job.last_ts = finding.ts
        self._jobs[finding.job_id] = job
        while len(self._jobs) > self._max_jobs:
            self._jobs.popitem(last=False)
        return job

    def _record_evidence(self, finding: SlowTasksDetected) -> set[str]:
        """Note each host's slow subtasks of this job (`host_evidence`: the per-job rule);
        returns the hosts slow now."""
        evidence, _ = host_evidence(finding, finding.hosts, self._rule)
        for subtask, host in evidence:
            key = _Evidence(finding.job_id, finding.vertex, subtask)
            self._evidence.setdefault(host, {})[key] = (finding.ts, finding.id)
        return {host for _, host in evidence}

    def _fresh_evidence(self, host: str, now: int) -> list[tuple[int, str]]:
        seen = self._evidence.get(host, {})
        for key in [k for k, (ts, _) in seen.items() if ts < now - self._memory_ms]:
            del seen[key]
        if not seen:
            self._evidence.pop(host, None)
        return sorted(seen.values())

    def _expire(self, finding: SlowTasksDetected) -> list[Record]:
        ended = [h for h, b in self._blocks.items() if b.until_ts <= finding.ts]
        for host in ended:
            del self._blocks[host]
        return [self._entry(finding, host, None) for host in sorted(ended)]

    def _known_hosts(self, now: int) -> set[str]:
        hosts: set[str] = set()
        for _, job in self._active_jobs(now):
            hosts |= job.hosts
        return hosts

    def _active_jobs(self, now: int) -> list[tuple[str, _JobSeen]]:
        # A job silent for longer than a block lasts has most likely ended; one still running
        # whose tasks are all healthy gets the list when it next reports (or at its next start).
        horizon = now - self._rule.duration_ms
        return [(j, s) for j, s in self._jobs.items() if s.last_ts >= horizon]

    def _update_blocks(self, finding: SlowTasksDetected, slow_now: set[str]) -> list[str]:
        """Block or extend the hosts the evidence of all jobs points at; returns those changed."""
        rule, now = self._rule, finding.ts
        until = now + rule.duration_ms
        known: set[str] | None = None  # only a new block needs it: every job's hosts
        candidates = []
        found = found_slow(finding, finding.hosts)
        for host in sorted(slow_now):
            fresh = self._fresh_evidence(host, now)
            if len(fresh) >= rule.min_evidence or host in found:
                candidates.append((-len(fresh), host, fresh))
        changed: list[str] = []
        for _, host, fresh in sorted(candidates):
            current = self._blocks.get(host)
            if current is not None and until - current.until_ts < rule.duration_ms / 2:
                continue
            if current is None:
                known = self._known_hosts(now) if known is None else known
                if len(self._blocks) + 1 > max_blocked_hosts(len(known), rule.fraction):
                    continue
                self._fleet_blocks += 1
            evidence = tuple(dict.fromkeys(finding_id for _, finding_id in fresh))
            jobs = len({e.job_id for e in self._evidence.get(host, {})})
            self._blocks[host] = _Block(until, evidence, jobs)
            changed.append(host)
        return changed

    def _entry(self, finding: SlowTasksDetected, host: str, block: _Block | None) -> FleetBlock:
        if block is None:
            return FleetBlock(
                job_id=finding.job_id,
                ts=finding.ts,
                id=derived_id(self.SERVICE, "fleet", finding.id, "expired", host),
                host=host,
                until_ts=None,
                cause="block expired",
            )
        return FleetBlock(
            job_id=finding.job_id,
            ts=finding.ts,
            id=derived_id(self.SERVICE, "fleet", finding.id, host),
            host=host,
            until_ts=block.until_ts,
            cause=f"slow attempts on {host} in {block.jobs} job(s)",
            evidence=block.evidence,
        )

    # ------------------------------------------------------------------ the jobs

    def _tell_jobs(self, finding: SlowTasksDetected, changed: list[str]) -> list[Record]:
        if not changed:  # most findings: no job to tell, and no walk over every job for it
            return []
        out: list[Record] = []
        if self._publish_view:
            out.extend(self._entry(finding, h, self._blocks[h]) for h in changed)
        now, half = finding.ts, self._rule.duration_ms / 2
        for job_id, job in self._active_jobs(now):
            held = job.held(now)
            sending: list[str] = []
            for host in changed:
                block = self._blocks[host]
                if host not in job.hosts or block.until_ts - job.holds.get(host, 0) < half:
                    continue  # not this job's host, or it holds this block already
                if host not in held and blocked_fraction_problem(
                    held | set(sending), (host,), job.hosts, self._rule.fraction
                ):
                    self._refused_by_job_cap += 1
                    continue
                sending.append(host)
            if sending:
                out.append(self._block_job(finding, job_id, job, tuple(sending)))
        return out

    def _block_job(
        self, finding: SlowTasksDetected, job_id: str, job: _JobSeen, hosts: tuple[str, ...]
    ) -> BlockNodes:
        until = max(self._blocks[h].until_ts for h in hosts)
        evidence = tuple(dict.fromkeys(i for h in hosts for i in self._blocks[h].evidence))
        job.holds.update(dict.fromkeys(hosts, until))
        self._jobs_told += 1
        return fleet_block_command(finding.id, finding.ts, job_id, hosts, until, evidence)


def fleet_block_command(
    finding_id: str,
    ts: int,
    job_id: str,
    hosts: tuple[str, ...],
    until_ts: int,
    evidence: tuple[str, ...],
) -> BlockNodes:
    """The `BlockNodes` the fleet sends `job_id` when finding `finding_id` (at `ts`) blocks or
    extends `hosts` on `evidence`: one function of its inputs, so a replay that lacks the other
    jobs' findings can still check a recorded fleet command was built from what it names."""
    return BlockNodes(
        job_id=job_id,
        ts=ts,
        id=derived_id(FleetBlocklist.SERVICE, "fleet", finding_id, job_id, *hosts),
        caused_by=evidence,
        hosts=hosts,
        until_ts=until_ts,
        cause=f"{FLEET_CAUSE_PREFIX}slow attempts on {', '.join(hosts)} across jobs"
        f" (evidence {', '.join(evidence)})",
    )
