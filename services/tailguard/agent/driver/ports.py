"""What the driver needs from the outside world, and the messages it receives from it.

The driver owns all job state on one thread. Everything else (runner connections, Spark's
runner jobs, the command consumer) talks to it only by posting one of these typed messages to
its inbox, so every decision happens in one order: the order of the events it publishes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from tailguard.model import records as r
from tailguard.model.authority import Origin, Unchecked

if TYPE_CHECKING:
    # Annotations only: the executor's modules import pyarrow and pandas, which every reader of
    # these messages (the Kafka adapter, observe mode's relay) would otherwise pay for at start.
    from tailguard.agent.executor.attempt import AttemptKey, TaskSpec
    from tailguard.agent.executor.protocol import AttemptEnded, AttemptProgressed, AttemptStarted

# --------------------------------------------------------------------------- inbox messages


@dataclass(frozen=True)
class RunnerConnected:
    """A slot runner proved the job secret and is ready for attempts."""

    slot: str
    host: str
    # The executor cores Spark reports on the host (what NodeAdded announces).
    host_slots: int


@dataclass(frozen=True)
class RunnerLost:
    """A runner's connection closed or its Spark task ended (whichever came first)."""

    slot: str
    reason: str


@dataclass(frozen=True)
class FromRunner:
    """A runner's report about the attempt it runs."""

    slot: str
    message: AttemptStarted | AttemptProgressed | AttemptEnded
    # When the driver received it (time.perf_counter), for the dispatch overhead.
    received: float


@dataclass(frozen=True)
class CommandReceived:
    """A command for this job, read from the log.

    `origin` is what the adapter found when it checked the command's signature: `Signed` by
    whom, `Unauthentic` and why, or `Unchecked` when no signing key is configured (then every
    command is taken, as before commands were signed).
    """

    command: r.Command
    origin: Origin = field(default_factory=Unchecked)


@dataclass(frozen=True)
class AgentThreadFailed:
    """A background thread of the agent died (the decision reader, a runner connection...):
    the job fails with its error rather than going on without what the thread did."""

    thread: str
    error: BaseException


@dataclass(frozen=True)
class StorageDone:
    """Storage I/O the driver handed to its storage thread (a sink commit, discarding an
    output) has ended: the driver continues it on its own thread (`storage_io.StorageWorker`)."""

    ticket: int


InboxMessage = (
    RunnerConnected | RunnerLost | FromRunner | CommandReceived | AgentThreadFailed | StorageDone
)
Post = Callable[[InboxMessage], None]


# --------------------------------------------------------------------------- ports


class Runtime(Protocol):
    """Where attempts run: slot runners on the cluster's executors (Spark implements it)."""

    def start(self, job_id: str, post: Post) -> int:
        """Start runners on the executors there are now; report through `post`. Returns how
        many runners were launched (each reports RunnerConnected or RunnerLost)."""

    def ensure_runners(self) -> int:
        """Start runners for executor cores without one (executors Spark added or gave back);
        returns how many were launched."""

    def executors(self) -> dict[str, int]:
        """Host -> slots of the live executors: the job's hosts, whether or not their runners
        have connected yet."""

    def deploy(self, slot: str, spec: TaskSpec) -> None:
        """Send an attempt to a connected runner (a failure to send arrives as RunnerLost)."""

    def cancel(self, slot: str, key: AttemptKey) -> None:
        """Ask the runner to stop the attempt (cooperative; it reports AttemptEnded)."""

    def close(self) -> None:
        """Stop every runner and release what the runtime holds."""


class Publisher(Protocol):
    """Where facts go (Kafka and the archive, or the archive alone). What the services send
    back is archived by the adapter's reader thread as it arrives, never from the driver's."""

    def publish(self, record: r.Record) -> None: ...

    def local(self, record: r.Record) -> None:
        """A decision the agent made itself as a fallback."""

    def close(self) -> None: ...
