"""Storage I/O off the driver's thread.

A sink commit copies a file and checks it, and discarding a loser's output deletes files: on an
object store each takes a round trip or more, during which the driver's inbox would wait. The
driver hands such work to one storage thread and goes on; when the work ends, a `StorageDone`
message brings it back to the driver's thread, where its continuation runs with the job's state.
Flink's JobMaster does the same with its main-thread executor: I/O completes a future elsewhere
and the continuation is posted back to the main thread (`FutureUtils`/`MainThreadExecutor`).

One thread keeps the work in the order it was given (a restarted sink subtask's second commit
follows its first).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from tailguard.agent.driver.ports import Post, StorageDone

# What runs on the driver's thread once the work ended: given the work's error, or None.
Continuation = Callable[[BaseException | None], None]


class StorageWorker:
    def __init__(self, post: Post) -> None:
        self._post = post
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tailguard-storage")
        self._pending: dict[int, tuple[Future[object], Continuation]] = {}
        self._tickets = 0

    def submit(self, work: Callable[[], object], then: Continuation) -> None:
        """Run `work` on the storage thread, then `then` on the driver's (through the inbox)."""
        self._tickets += 1
        ticket = self._tickets
        future = self._executor.submit(work)
        # The message may arrive before the entry is made: it is read on this same thread, later.
        self._pending[ticket] = (future, then)
        future.add_done_callback(lambda _: self._post(StorageDone(ticket)))

    @property
    def busy(self) -> bool:
        """Work given whose continuation has not run yet."""
        return bool(self._pending)

    def complete(self, message: StorageDone) -> None:
        """On the driver's thread: continue the work `message` names (unless `settle` did)."""
        entry = self._pending.pop(message.ticket, None)
        if entry is not None:
            future, then = entry
            then(future.exception())

    def settle(self) -> None:
        """On the driver's thread, at the job's end: wait for the work in flight and continue
        it, in order, so its facts precede the job's end."""
        while self._pending:
            ticket = min(self._pending)
            future, then = self._pending.pop(ticket)
            then(future.exception())

    def close(self) -> None:
        self._executor.shutdown(wait=True)
