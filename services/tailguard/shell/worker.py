"""Running one service: `python -m tailguard.shell.worker NAME` (what `tailguard services up`
starts, once per service, as its own process).

Start-up order matters: the metrics socket first (so a supervisor sees the process: its
/metrics and /health are views of the faust app's own web server, which answers what waited in
that socket once the app's producer is connected: metrics_http), then two things at
once: the state's load (`StateLoad`: the last snapshot, tailguard.shell.snapshot, and the input
topic's tail after it up to the group's committed offsets) in a thread, and the faust stream's
start, whose group join mostly waits on the broker (after a kill -9, for the dead member's
session). The stream feeds the core nothing before the load is done, and resumes at those
committed offsets. `/health` turns ready only when both are, and unready again while the broker
cannot be reached (tailguard.shell.broker_watch).

A stop (SIGTERM, Ctrl-C) is faust's clean shutdown, then a last snapshot; with the broker gone,
the last snapshot and an exit at once instead (`ServiceWorker`).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import logging
import os
import signal
import sys
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import faust
from confluent_kafka import KafkaException
from faust.types import TP
from faust.worker import Worker

from tailguard import logs
from tailguard.codec import codec_for
from tailguard.kafka.config import configured_fetch_wait_ms, faust_app_options, fetch_wait
from tailguard.kafka.topic_scan import read_only_consumer, read_to_end
from tailguard.model.config import ConfigError, Settings
from tailguard.settings_file import load_settings
from tailguard.shell import stop_report
from tailguard.shell.answering import BatchedAnswers
from tailguard.shell.broker_watch import BrokerWatch
from tailguard.shell.instances import instance_name
from tailguard.shell.log_limits import RepeatLimiter
from tailguard.shell.metrics_http import listening_socket, serve_on_app, web_options
from tailguard.shell.processor import Outgoing, Processor
from tailguard.shell.rebuild import catch_up, rebuild, snapshot_mismatch
from tailguard.shell.snapshot import (
    PeriodicSnapshots,
    SnapshotError,
    SnapshotStore,
    carried_over,
    digest,
)
from tailguard.shell.stop_report import FlushTracker
from tailguard.shell.supervisor import announce, services_dir
from tailguard.system.services import SERVICE_NAMES, Service, service_named

log = logging.getLogger("tailguard.service")

# Commit offsets often: outputs are awaited before the input is acknowledged, so the interval only
# bounds how much input a restarted service processes a second time.
COMMIT_INTERVAL_S = 0.5
SESSION_TIMEOUT_S = 6.0


# faust-streaming 0.15 hard-codes fetch_max_wait_ms=1500 for its consumer (AIOKafkaConsumer's
# arguments in faust/transport/drivers/aiokafka.py; no setting reaches it), and librdkafka's mock
# cluster (the embedded broker) answers a fetch with no data only when that wait expires, even if
# data arrives meanwhile: every decision would wait ~0.75 s on average (measured: round trip
# p50 1.4 s). On the embedded broker a short wait bounds each hop (event -> finding -> command),
# but every empty fetch is Python work in aiokafka: idle, the five services and the broker took
# 51% of a CPU at 5 ms, 19% at 20 ms, 7% at 100 ms (2 cores, nothing else running); 20 jobs at
# a real job's rate (benchmarks/load.py) gave an end-to-end p50 of 16.1 ms at 5 ms and 24.8 ms
# at 20 ms. On a 2-core machine that CPU is the jobs' own, so 20 ms. Kafka answers as soon as
# data arrives and gets its own default (`kafka_config.fetch_wait`).
EMBEDDED_FETCH_WAIT_MS = 20

# faust ends its worker when the broker it comes back to has lost the group (an embedded broker
# restarted empty: GroupIdNotFound in the heartbeat). Within this long of a lost broker, such an
# end is a reconnect to make, not a failure to report.
RECONNECT_WINDOW_S = 120.0


def _shorten_fetch_wait(
    max_wait_ms: int, on_commit: Callable[[dict[int, int]], None] | None = None
) -> None:
    """faust's consumer with fetches of at most `max_wait_ms` (until `set_fetch_wait`);
    `on_commit` hears the offsets (partition -> next offset) each commit the broker confirmed
    (what a stop without the broker could not flush: `stop_report`). A patch of faust's consumer
    class, kept because faust offers neither: the wait is hard-coded, and its commit reports
    no offsets to anyone (it keeps them privately, per partition, without saying when)."""
    from faust.transport.drivers import aiokafka as driver

    base = driver.aiokafka.AIOKafkaConsumer
    if not hasattr(base, "_tailguard_fetch_wait"):

        class Consumer(base):  # type: ignore[misc, valid-type]
            _tailguard_fetch_wait = max_wait_ms
            _tailguard_on_commit: Callable[[dict[int, int]], None] | None = None
            _tailguard_live: ClassVar[weakref.WeakSet[Any]] = weakref.WeakSet()

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                kwargs["fetch_max_wait_ms"] = type(self)._tailguard_fetch_wait
                super().__init__(*args, **kwargs)
                type(self)._tailguard_live.add(self)

            async def commit(self, offsets: Any = None) -> None:
                await super().commit(offsets)  # raises unless the broker confirmed it
                told = type(self)._tailguard_on_commit
                if told is not None and offsets:
                    told({tp.partition: getattr(at, "offset", at) for tp, at in offsets.items()})

        driver.aiokafka.AIOKafkaConsumer = base = Consumer
    base._tailguard_on_commit = staticmethod(on_commit) if on_commit is not None else None
    set_fetch_wait(max_wait_ms)


def set_fetch_wait(max_wait_ms: int) -> None:
    """From now on, fetches of faust's consumer wait at most `max_wait_ms`, also a consumer
    already made (which asks with it from its next fetch on: aiokafka's fetcher reads the value
    at each request); what the broker turned out to be decides it (`kafka_config.fetch_wait`).
    The consumer runs in faust's consumer thread: an int attribute swaps whole."""
    from faust.transport.drivers import aiokafka as driver

    patched = driver.aiokafka.AIOKafkaConsumer
    patched._tailguard_fetch_wait = max_wait_ms
    for consumer in list(patched._tailguard_live):
        consumer._fetch_max_wait_ms = max_wait_ms
        fetcher = getattr(consumer, "_fetcher", None)
        if fetcher is not None:
            fetcher._fetch_max_wait_ms = max_wait_ms


class ServiceWorker(Worker):
    """faust's worker, whose stop on SIGTERM or Ctrl-C first asks `stop_without_broker`, which
    returns only if the broker answers. faust's shutdown commits and leaves its group, and with
    the broker gone it waits for it: `services down` sat out its 20 s grace per service, then
    killed each one before its last snapshot."""

    def __init__(
        self, app: faust.App, stop_without_broker: Callable[[], Awaitable[None]], **options: Any
    ):
        self._stop_without_broker = stop_without_broker
        super().__init__(app, **options)

    async def _stop_on_signal(self, sig: signal.Signals) -> None:
        # Where mode's SIGTERM and SIGINT handlers both lead, once.
        await self._stop_without_broker()
        await super()._stop_on_signal(sig)


class StateLoad:
    """The service's state load (`load`: snapshot fold and tail read, returning the periodic
    snapshots to keep) in a thread of its own, so that it overlaps the stream's start instead of
    preceding it: a restart's ready time is then the longer of the two, not their sum (measured
    before: 2.4 s of load, then 6.3 s of stream start). A load that fails ends the process
    (`on_failure`): a service must not decide from a state it could not rebuild."""

    def __init__(
        self,
        load: Callable[[], PeriodicSnapshots],
        on_failure: Callable[[BaseException], None],
    ) -> None:
        self._load = load
        self._on_failure = on_failure
        self._future: concurrent.futures.Future[PeriodicSnapshots] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, name="state-load", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            self._future.set_result(self._load())
        except BaseException as err:  # whatever it is, the process must end
            self._future.set_exception(err)
            self._on_failure(err)

    def loaded(self) -> PeriodicSnapshots | None:
        """The periodic snapshots once the load is done, else None (still loading or failed)."""
        if not self._future.done() or self._future.exception() is not None:
            return None
        return self._future.result()

    async def wait(self) -> PeriodicSnapshots:
        return await asyncio.wrap_future(self._future)


class ServiceState:
    def __init__(self, broker: BrokerWatch | None = None) -> None:
        self.ready = False
        self.broker = broker
        # What the broker has confirmed of the stream's work (for a stop without it).
        self.flushed = FlushTracker()

    def unhealthy(self) -> str | None:
        """What /health reports: None when healthy, else why not."""
        if not self.ready:
            return "starting"
        return self.broker.unhealthy_reason() if self.broker is not None else None


def build_app(
    definition: Service,
    connection: Mapping[str, Any],
    processor: Processor,
    state: ServiceState,
    data_dir: Path,
    state_load: StateLoad | None = None,
    fetch_wait_ms: int = EMBEDDED_FETCH_WAIT_MS,
    settings: Settings | None = None,
    web: Mapping[str, Any] | None = None,
) -> faust.App:
    """The service's faust app; `connection` is `faust_app_options(settings)` (the broker and
    the credentials built from the same `kafka.*` settings as every librdkafka client). With a
    `state_load`, the stream feeds its core nothing before that load is done. Its consumer's
    fetches wait at most `fetch_wait_ms` for data (`kafka_config.fetch_wait`). With `settings`
    (the Kafka settings), a partition taken over from another instance in the group is caught up
    from the topic before its first record is decided (`rebuild.catch_up`). `web` is its web
    server's settings (`metrics_http.web_options`); none without it."""
    _shorten_fetch_wait(fetch_wait_ms, state.flushed.committed)
    flushed = state.flushed
    app = faust.App(
        definition.group_id,
        **connection,
        # The embedded broker has no CreateTopics: topics appear on first produce, and faust
        # must neither declare them nor use its leader-election topic.
        topic_allow_declare=False,
        topic_disable_leader=True,
        store="memory://",
        **(web or {"web_enabled": False}),
        datadir=str(data_dir),
        consumer_auto_offset_reset="earliest",
        broker_commit_interval=COMMIT_INTERVAL_S,
        # A service killed with -9 leaves its group membership behind; its restart gets the
        # partitions only once that session expires, so keep it short (heartbeats every 1 s).
        broker_session_timeout=SESSION_TIMEOUT_S,
        broker_heartbeat_interval=1.0,
        broker_rebalance_timeout=SESSION_TIMEOUT_S,
    )
    source = app.topic(definition.input_topic, key_serializer="raw", value_serializer="raw")
    sinks: dict[str, Any] = {}

    def sink(name: str) -> Any:
        if name not in sinks:
            sinks[name] = app.topic(name, key_serializer="raw", value_serializer="raw")
        return sinks[name]

    async def catch_up_to(partition: int, start: int, end: int) -> None:
        # Blocking reads, in a thread; the stream waits, so the core is fed by one at a time.
        assert settings is not None
        began = time.monotonic()
        fed = await asyncio.get_running_loop().run_in_executor(
            None,
            lambda: catch_up(
                settings, definition.group_id, definition.input_topic, partition, start, end,
                processor.replay,
            ),
        )  # fmt: skip
        log.info(
            "%s: caught up on %s[%d] from offset %d to %d before deciding: %d records another "
            "instance processed, in %.2f s",
            definition.name, definition.input_topic, partition, start, end, fed,
            time.monotonic() - began,
        )  # fmt: skip

    async def send(out: Outgoing) -> Any:
        return await sink(out.topic).send(
            key=out.key, value=out.value, headers=out.headers or None, force=True
        )

    def lag(message: Any) -> int:
        highwater = app.consumer.highwater(message.tp)
        return max(0, int(highwater or 0) - int(message.offset) - 1)

    @app.agent(source, name=f"{definition.name}-core")
    async def process(stream: Any) -> None:
        # The consumer fetches meanwhile; the core takes input only once its state is loaded.
        snapshots = await state_load.wait() if state_load is not None else None
        # Acknowledged by the batch, once its outputs are on the broker (shell.answering).
        manual = stream.noack()
        waiting = manual.channel.queue
        answers = BatchedAnswers(processor, send, manual.ack, flushed, snapshots, lag)
        async for event in manual.events():
            message = event.message
            behind = processor.unseen_from(message.partition, message.offset)
            if behind is not None and settings is not None:
                await answers.end_batch()  # the core fed by one at a time: the batch's first
                await catch_up_to(message.partition, behind, message.offset)
            await answers.answer(event, more_waiting=not waiting.empty())

    @app.on_partitions_assigned.connect  # type: ignore[arg-type]  # faust types it sync
    async def assigned(_app: Any, assigned: set[TP], **_: Any) -> None:
        # Which instance owns what, after every rebalance (scale-out: docs/services.md).
        owned = sorted(tp.partition for tp in assigned if tp.topic == definition.input_topic)
        processor.metrics.partitions_owned.set(len(owned))
        log.info("%s owns %s partitions %s", definition.name, definition.input_topic, owned)

    @app.task  # type: ignore[untyped-decorator]  # faust.App.task has no annotations
    async def started() -> None:
        if state_load is not None:
            await state_load.wait()
        state.ready = True
        processor.metrics.ready.set(1)
        log.info("%s consuming %s", definition.name, definition.input_topic)

    return app


def serve(
    name: str,
    settings: Settings,
    work_dir: Path,
    metrics_port: int,
    metrics_host: str,
    log_handler: logging.Handler,
    instance: int = 1,
) -> int:
    definition = service_named(name)
    if instance > 1 and not definition.scales_out:
        raise ConfigError(f"{name} runs as one instance: {definition.one_instance_why}")
    # Its files (announcement, snapshot, stop report) are the instance's; the consumer group
    # is the service's, shared by all its instances.
    own = instance_name(name, instance)
    # First, so that Kafka settings the faust client cannot honour stop the service at once.
    connection = faust_app_options(settings)
    configured_fetch_wait_ms(settings)
    codec = codec_for(settings)
    processor = Processor(definition, settings, codec)
    state = ServiceState()

    # Listening from here on, served by the app's web server once it runs (metrics_http).
    metrics = listening_socket(metrics_host, metrics_port)
    metrics_url = f"http://{metrics_host}:{metrics.getsockname()[1]}"
    announce(work_dir, own, os.getpid(), metrics_url)
    log.info("%s metrics on %s/metrics", own, metrics_url)
    data_dir = work_dir / "services" / own
    data_dir.mkdir(parents=True, exist_ok=True)
    store = SnapshotStore(data_dir / "snapshot.avro")

    def load_state() -> PeriodicSnapshots:
        started = time.monotonic()
        start_at, restored = restore(settings, definition, processor, store)
        rebuilt = rebuild(
            settings, definition.group_id, definition.input_topic, processor.replay, start_at
        )
        # Input the snapshot holds beyond the committed offsets: the stream resumes at those
        # offsets, and must not feed it to the core a second time.
        processor.restored_up_to = {
            p: at for p, at in start_at.items() if at > rebuilt.committed.get(p, 0)
        }
        state.flushed.committed(rebuilt.committed)
        processor.metrics.mark_live()
        log.info(
            "%s rebuilt its state in %.2f s: %d records from its snapshot, %d from the topic",
            name,
            time.monotonic() - started,
            restored,
            rebuilt.fed,
        )
        snapshots = PeriodicSnapshots(store, processor.snapshot)
        if rebuilt.fed or not (start_at or restored):
            # A snapshot now, so the next restart does not read this one's tail again. Not when
            # the snapshot just folded is the state already (nothing read after it): that would
            # write the same records again.
            snapshots.take_now()
        return snapshots

    def load_failed(err: BaseException) -> None:
        # The stream may be half started (faust's threads, a group join): no clean way back to
        # the main thread's exit, so this thread ends the process, leaving the snapshot on disk
        # as it was. The supervisor sees the exit code.
        log.error("%s cannot load its state: %s", name, err, exc_info=err)
        logging.shutdown()
        os._exit(1)

    state_load = StateLoad(load_state, load_failed)
    state_load.start()
    # Until the broker has answered (the watch's first probe, once the app's producer is
    # connected), a provisional wait; the broker's answer, never a slow probe, decides it.
    wait = fetch_wait(settings, None, EMBEDDED_FETCH_WAIT_MS)
    log.info("%s: fetches wait up to %d ms (%s)", name, wait.ms, wait.why)
    app = build_app(
        definition, connection, processor, state, data_dir, state_load, wait.ms, settings,
        web_options(metrics),
    )  # fmt: skip
    serve_on_app(app, metrics, processor.metrics.exposition, state.unhealthy)

    def broker_named(cluster_id: str) -> None:
        fitting = fetch_wait(settings, cluster_id, EMBEDDED_FETCH_WAIT_MS)
        set_fetch_wait(fitting.ms)
        log.info("%s: fetches wait up to %d ms (%s)", name, fitting.ms, fitting.why)

    broker = state.broker = BrokerWatch(lambda: producer_client(app), on_cluster=broker_named)

    @app.task  # type: ignore[untyped-decorator]  # faust.App.task has no annotations
    async def watch_broker() -> None:
        await broker.run(lambda: app.should_stop, app.sleep)

    # aiokafka logs every failed reconnect while the broker is away.
    log_handler.addFilter(RepeatLimiter())
    # faust (mode) replaces the root logger's handlers when the worker starts: hand it ours
    # (app.conf.loghandlers) and an incremental config that changes no level, so the levels
    # `logs.configure` set stay (tailguard's INFO, other libraries' WARNING). A level below
    # WARN also keeps faust's terminal spinner, which would raise our handler to WARN, out of
    # the log file.
    app.conf.loghandlers = [log_handler]

    async def stop_without_broker() -> None:
        # Called on the event loop (faust's signal handler). After the probe, what follows runs
        # without yielding to the stream, so between two inputs' steps: the core is not being
        # changed meanwhile.
        if not await broker.cut_off():
            return
        log.warning("%s: stopping with its broker unreachable: %s", name, broker.state.reason)
        snapshots = state_load.loaded()
        if snapshots is None:
            kept = f"the snapshot on disk kept ({store.path}): the state was still loading"
        elif snapshots.answering:
            kept = (
                f"the last snapshot kept ({store.path}): an input's outputs were not yet on the "
                "broker"
            )
        else:
            kept = f"snapshot written to {store.path}"
        if snapshots is not None:
            snapshots.close()  # written and fsynced before the exit below
        written = snapshots is not None and not snapshots.answering
        report = state.flushed.report(os.getpid(), broker.state.reason, written, kept)
        log.warning(
            "%s: %s; exiting without faust's shutdown, which would wait for the broker",
            name,
            report.describe(),
        )
        # For `services down`, which says it (supervisor.stop).
        stop_report.write(services_dir(work_dir), own, report)
        logging.shutdown()
        os._exit(0)

    worker = ServiceWorker(
        app,
        stop_without_broker,
        loglevel="info",
        quiet=True,
        redirect_stdouts=False,
        logging_config={"version": 1, "incremental": True},
    )
    code = 0
    try:
        worker.execute_from_commandline()
    except SystemExit as done:
        code = int(done.code or 0)
    finally:
        metrics.close()
    snapshots = state_load.loaded()
    if snapshots is None:
        # Stopped while the state was loading: the snapshot on disk is still the last state.
        return code
    if code != 0 and broker.lost_within(RECONNECT_WINDOW_S) and not snapshots.answering:
        snapshots.close()
        carry_over(settings, definition, processor, store)
        # faust cannot be started twice in one process: the same command again, which folds
        # the state just written and reconnects (the metrics socket is closed at exec).
        log.warning("%s: its stream ended after the broker was lost; starting again", name)
        logging.shutdown()
        os.execv(sys.executable, sys.orig_argv)
    snapshots.close()
    return code


def producer_client(app: faust.App) -> Any:
    """The aiokafka client of the app's producer once it has started (AIOKafkaClient), else
    None: the app's own connection, which the broker watch asks."""
    producer = getattr(app.producer, "_producer", None)
    return getattr(producer, "client", None)


def carry_over(
    settings: Settings, definition: Service, processor: Processor, store: SnapshotStore
) -> None:
    """Keep the state across a broker's loss. A broker back with the same log (real Kafka) gets
    the snapshot as it is; an embedded broker restarted empty has lost every record the state
    was folded from, so the state is carried over to its new log (snapshot.carried_over): the
    jobs that were running go on being decided as one continuous history. Read by librdkafka
    (rebuild.py says why): faust's app and its client have stopped by now."""
    snapshot = processor.snapshot()
    try:
        mismatch = snapshot_mismatch(
            settings, definition.group_id, definition.input_topic, snapshot.positions
        )
    except KafkaException as err:
        log.warning(
            "%s: cannot compare with the broker's log (%s): snapshot kept", definition.name, err
        )
        mismatch = None
    if mismatch is not None:
        log.warning(
            "%s: the broker's log is new (%s): state carried over", definition.name, mismatch
        )
        new_log = records_on_topic(settings, definition)
        snapshot = carried_over(
            snapshot, lambda kept: new_log.get((kept.partition, kept.offset)) == digest(kept.value)
        )
    store.write(snapshot)


def records_on_topic(settings: Settings, definition: Service) -> dict[tuple[int, int], str]:
    """(partition, offset) -> digest of every record on the service's input topic now: a log
    just begun again by a restarted embedded broker, so a short read."""
    consumer = read_only_consumer(settings, definition.group_id)
    try:
        return {
            (msg.partition() or 0, msg.offset() or 0): digest(msg.value())
            for msg in read_to_end(consumer, definition.input_topic)
        }
    finally:
        consumer.close()


def restore(
    settings: Settings, definition: Service, processor: Processor, store: SnapshotStore
) -> tuple[dict[int, int], int]:
    """Fold the service's snapshot into its core if it is one of this topic's log; returns the
    positions to read the topic from (none: from the beginning) and the records folded."""
    try:
        snapshot = store.read(definition.name, definition.input_topic)
    except SnapshotError as err:
        log.warning("%s: snapshot ignored, rebuilding from the topic: %s", definition.name, err)
        return {}, 0
    if snapshot is None:
        return {}, 0
    mismatch = snapshot_mismatch(
        settings, definition.group_id, definition.input_topic, snapshot.positions
    )
    if mismatch is not None:
        log.warning(
            "%s: snapshot %s ignored, rebuilding from the topic: %s",
            definition.name,
            store.path,
            mismatch,
        )
        return {}, 0
    restored = processor.restore(snapshot)
    return {p: pos.next_offset for p, pos in snapshot.positions.items()}, restored


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tailguard.shell.worker")
    parser.add_argument("service", choices=SERVICE_NAMES)
    parser.add_argument("--config", help="TOML settings file")
    parser.add_argument("--metrics-port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--metrics-host", default="127.0.0.1")
    parser.add_argument("--work-dir", help="default: the tailguard.work-dir setting")
    parser.add_argument(
        "--instance",
        type=int,
        default=1,
        help="which instance of the service this is (its files' names; the group is shared)",
    )
    logs.add_format_argument(parser, default="text")
    args = parser.parse_args(argv)
    handler = logs.configure(args.log_format, service=args.service)
    extra = {"tailguard.work-dir": args.work_dir} if args.work_dir else None
    try:
        settings = load_settings(args.config, extra=extra)
        # Secret values are known now: no log line may show one, whatever logs it.
        logs.hide_secrets(settings, handler)
        work_dir = Path(settings["tailguard.work-dir"])
        return serve(
            args.service, settings, work_dir, args.metrics_port, args.metrics_host, handler,
            args.instance,
        )  # fmt: skip
    except ConfigError as err:
        # A clear line in the service's log instead of a traceback (messages name the setting,
        # never a secret value).
        log.error("%s cannot start: %s", args.service, err)
        return 2


if __name__ == "__main__":
    sys.exit(main())
