"""The embedded broker: Apache Kafka's own broker (the default) or librdkafka's mock cluster.

    with EmbeddedBroker("work") as bootstrap:
        ...  # clients connect to `bootstrap`

By default it is **Apache Kafka**, one node in KRaft combined mode (`broker/kafka_server.py`), its
jars resolved from Maven Central once (`broker/kafka_jars.py`). Its log is on disk under
`<work_dir>/kafka/`: a broker stopped, or killed -9, starts again on its data and its address,
and `stop(purge=True)` deletes them.

With `mock=True` it is librdkafka's mock cluster held by a background process: an offline option
for a machine that cannot reach Maven Central. It is **in memory**: everything produced to it is
lost when it stops (docs/log.md#the-mock-broker).

`start()` is idempotent: if the state file names a live broker, that broker is reused; a state
file left by a dead process (a broker killed, or its machine rebooted) is replaced by a broker on
the address the dead one had, so every client of the dead broker reconnects to the new one by
itself.
"""

from __future__ import annotations

import fcntl
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from tailguard.broker.acls import ADMIN, declared_acls
from tailguard.kafka.bootstrap import DEFAULT_WORK_DIR, BrokerError
from tailguard.kafka.broker_state import (
    BROKER_MODULE,
    BrokerState,
    read_state,
    remove_state,
    state_path,
    write_state,
)
from tailguard.model.durations import seconds_text
from tailguard.processes import supervised

LOG_FILE = "broker.log"
LOCK_FILE = "broker.lock"


def broker_name(mock: bool) -> str:
    """What the embedded broker is, for progress lines and benchmark reports."""
    return "librdkafka's mock cluster" if mock else "Apache Kafka"


class EmbeddedBroker:
    """Start, find and stop the embedded broker whose state lives under `work_dir`."""

    def __init__(
        self,
        work_dir: str | Path = DEFAULT_WORK_DIR,
        *,
        mock: bool = False,
        listen: str | None = None,
        start_timeout_s: float = 120.0,
        report: Callable[[str], None] | None = None,
        secure: bool = False,
    ):
        """`mock`: librdkafka's in-memory mock instead of Apache Kafka; `listen`: HOST:PORT for
        Kafka to listen on and advertise (default: the address of its last start, else a free
        port on 127.0.0.1); `report` is told the progress of a start (resolving the jars,
        formatting, waiting); `secure`: Kafka with SASL_SSL, SCRAM logins and ACLs
        (broker/secure.py; a broker made so stays so)."""
        self.work_dir = Path(work_dir)
        self.mock = mock
        self.listen = listen
        self.start_timeout_s = start_timeout_s
        self.report = report or (lambda _message: None)
        self.secure = secure
        # Set when this instance launched the process (not when it reused a running one).
        self.started_here = False

    @property
    def name(self) -> str:
        return broker_name(self.mock)

    @property
    def state_file(self) -> Path:
        return state_path(self.work_dir)

    def status(self) -> BrokerState | None:
        """The running broker's state, or None if none is running under this work dir."""
        state = read_state(self.work_dir)
        if state is None or not state.ours():
            return None
        return state

    def start(self) -> str:
        """Start the broker in a detached process (or reuse a running one); its bootstrap."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        # One starter at a time per work dir, or two concurrent starts would launch two brokers.
        with (self.work_dir / LOCK_FILE).open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            return self._start_locked()

    def _start_locked(self) -> str:
        running = self.status()
        if running is not None:
            return running.bootstrap
        # Whatever is there describes a dead process: its port is where its clients look.
        crashed = read_state(self.work_dir)
        if not self.mock:
            remove_state(self.work_dir)
            return self._start_kafka()
        port = [str(crashed.port)] if crashed is not None and crashed.port else []
        remove_state(self.work_dir)
        process = supervised.launch(
            [sys.executable, "-m", BROKER_MODULE, str(self.work_dir.resolve()), *port],
            self.work_dir / LOG_FILE,
        )

        def ready() -> bool:
            state = read_state(self.work_dir)
            return (state is not None and state.pid == process.pid) or process.poll() is not None

        if not supervised.wait_until(ready, self.start_timeout_s):
            process.kill()
            process.wait()
            raise BrokerError(
                f"embedded broker did not become ready in {seconds_text(self.start_timeout_s)}; "
                f"see {self.work_dir / LOG_FILE}"
            )
        if process.poll() is not None:
            raise BrokerError(
                f"embedded broker exited with status {process.returncode}; "
                f"see {self.work_dir / LOG_FILE}"
            )
        self.started_here = True
        state = read_state(self.work_dir)
        assert state is not None
        return state.bootstrap

    def _start_kafka(self) -> str:
        from tailguard.broker import kafka_server

        try:
            process, address, secured = kafka_server.launch(
                self.work_dir,
                self.listen,
                self.work_dir / LOG_FILE,
                self.report,
                secure=self.secure,
            )
        except (kafka_server.KafkaServerError, ValueError, RuntimeError) as err:
            raise BrokerError(str(err)) from None
        admin = secured.librdkafka_config(ADMIN) if secured is not None else None
        # Written before it is ready: a starter killed now leaves a broker the next one finds.
        write_state(
            self.work_dir,
            BrokerState(
                process.pid,
                address.bootstrap,
                time.time(),
                kind="kafka",
                created=supervised.create_time(process.pid) or 0.0,
            ),
        )
        self.report(f"Apache Kafka broker starting (pid {process.pid}) at {address.bootstrap}")
        try:
            kafka_server.await_ready(
                address.bootstrap, process, self.start_timeout_s, self.report, security=admin
            )
            created = kafka_server.create_topics(address.bootstrap, security=admin)
            if admin is not None:
                count = kafka_server.create_acls(address.bootstrap, admin, declared_acls())
                self.report(f"secured: SASL_SSL, SCRAM-SHA-512, {count} ACLs (docs/security.md)")
        except BaseException as err:
            process.kill()
            process.wait()
            remove_state(self.work_dir, only_pid=process.pid)
            if isinstance(err, kafka_server.KafkaServerError):
                raise BrokerError(f"{err}; see {self.work_dir / LOG_FILE}") from None
            raise
        if created:
            self.report(f"created topics: {', '.join(sorted(created))}")
        self.started_here = True
        return address.bootstrap

    def purge(self) -> bool:
        """Delete the Kafka broker's data (it must not be running); whether there was any."""
        from tailguard.broker import kafka_server

        if self.status() is not None:
            raise BrokerError("the broker is running: stop it before deleting its data")
        return kafka_server.purge(self.work_dir)

    def stop(self, timeout_s: float = 60.0, *, purge: bool = False) -> bool:
        """Stop the running broker; False if none was running. A mock's data is gone afterwards;
        Kafka's stays for the next start unless `purge`."""
        state = self.status()
        if state is None:
            remove_state(self.work_dir)
            if purge:
                self.purge()
            return False
        if not supervised.Supervised(state.pid, state.created).stop(timeout_s):
            self.report(
                f"embedded broker (pid {state.pid}) did not stop in {seconds_text(timeout_s)}: "
                "killed"
            )
        remove_state(self.work_dir, only_pid=state.pid)
        if purge:
            self.purge()
        return True

    def __enter__(self) -> str:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
