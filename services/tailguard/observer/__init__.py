"""Observe mode: tailguard's detector and blocklist on PySpark jobs tailguard does not run.

    import tailguard
    observation = tailguard.observe(spark)      # any running SparkSession or SparkContext
    ... the job, unchanged ...
    observation.close()                          # or spark.stop(): the relay ends with the app

or with no code at all (docs/observe.md):

    spark-submit --jars "$(python -m tailguard.observer jar)" \\
      --conf spark.extraListeners=tailguard.observe.TaskEventListener job.py

A JVM listener (`java/`) writes Spark's task events to a relay process (`relay.py`), which
translates them (`translate.py`) into tailguard events and publishes them (`publisher.py`).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any

from tailguard.observer.jar import LISTENER_CLASS, JarBuildError, listener_jar

__all__ = [
    "JarBuildError",
    "Observation",
    "ignoring",
    "jar_class",
    "listener_jar",
    "new_listener",
    "observe",
    "spark_context",
    "start_listener",
]
_log = logging.getLogger(__name__)

# The Spark local property that leaves a job out of what is published (the listener's IGNORE).
IGNORE_PROPERTY = "tailguard.ignore"


@contextlib.contextmanager
def ignoring(spark: Any) -> Iterator[None]:
    """The Spark jobs this thread starts inside the block are left out: their events are not
    published, so the services neither judge nor command them, and attach mode's query-stage
    rule leaves their stages to Spark. For work that is not the application's: a warm-up that
    starts the executors' Python workers (its cold tasks would read as slow hosts), a probe, a
    sample. Spark's local property `tailguard.ignore=true`, set for the block on this thread
    and restored after it (from Scala or Java: `sc.setLocalProperty("tailguard.ignore",
    "true")`). Without a listener it changes nothing."""
    sc = spark_context(spark, "ignoring")
    before = sc.getLocalProperty(IGNORE_PROPERTY)
    sc.setLocalProperty(IGNORE_PROPERTY, "true")
    try:
        yield
    finally:
        sc.setLocalProperty(IGNORE_PROPERTY, before)  # None removes it


class Observation:
    """A listener attached to a running SparkContext; `close()` detaches it and waits until the
    relay has published everything (the services' last decisions included)."""

    def __init__(self, sc: Any, listener: Any, app_id: str) -> None:
        self._sc = sc
        self._listener = listener
        self._attached = True
        self.app_id = app_id
        self.exit_status: int | None = None

    def pause(self, timeout_s: float = 60.0) -> None:
        """Stop observing: the Spark jobs that start from now on are not published, until
        `resume()`. The relay stays up, idle. Call it between jobs: a job running across it
        loses the events Spark posts while paused (its end too, so it stays open)."""
        if not self._attached:
            return
        from py4j.protocol import Py4JJavaError

        context = self._sc._jsc.sc()
        # Spark delivers events on its own thread: the last job's ends may still be queued,
        # and a listener removed before they reach it would leave that job open.
        try:
            context.listenerBus().waitUntilEmpty(int(timeout_s * 1000))
        except Py4JJavaError as err:  # a TimeoutException: detach with what has arrived
            _log.warning("observe: Spark's listener bus did not drain: %s", err)
        context.removeSparkListener(self._listener)
        self._attached = False

    def ignoring(self) -> contextlib.AbstractContextManager[None]:
        """Leave the Spark jobs this thread starts in the block out (`ignoring`)."""
        return ignoring(self._sc)

    def resume(self) -> None:
        """Observe again, from the next Spark event on (`make bench-observe-within` times the
        same application's jobs paused and observed)."""
        if self.exit_status is not None:
            raise RuntimeError("this observation is closed: call tailguard.observe() again")
        if not self._attached:
            self._sc._jsc.sc().addSparkListener(self._listener)
            self._attached = True

    def close(self, timeout_s: float = 60.0) -> int:
        """The relay's exit status (0: all published; -1: it did not end within the timeout)."""
        if self.exit_status is None:
            self.pause(timeout_s)
            now = int(time.time() * 1000)
            self.exit_status = int(self._listener.finish(now, int(timeout_s * 1000)))
        return self.exit_status

    def __enter__(self) -> Observation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# tailguard's jar, loaded once per JVM (by its gateway): py4j caches methods by class name, so a
# second copy of a class from a second loader would be called with the first's methods. One
# loader for all of the jar's classes: the listener's `setActuator` takes the actuator its own
# loader defined.
_JAR_LOADERS: dict[int, Any] = {}


def jar_class(sc: Any, name: str) -> Any:
    """Class `name` of tailguard's jar, in the JVM behind SparkContext `sc`."""
    gateway, jvm, jsc = sc._gateway, sc._jvm, sc._jsc
    loader = _JAR_LOADERS.get(id(gateway))
    if loader is None:
        urls = gateway.new_array(jvm.java.net.URL, 1)
        urls[0] = jvm.java.io.File(str(listener_jar())).toURI().toURL()
        # A loader of its own: the driver's classpath was fixed when its JVM started. Its parent
        # is Spark's loader, so the listener is the SparkListenerInterface Spark knows.
        loader = _JAR_LOADERS[id(gateway)] = jvm.java.net.URLClassLoader(
            urls, jsc.getClass().getClassLoader()
        )
    return loader.loadClass(name)


def spark_context(spark: Any, verb: str) -> Any:
    """The SparkContext behind `spark` (a SparkSession or a SparkContext)."""
    sc = getattr(spark, "sparkContext", spark)
    if getattr(sc, "_jsc", None) is None:
        raise TypeError(
            f"{verb}() needs a SparkSession or SparkContext, not {type(spark).__name__}"
        )
    return sc


def new_listener(
    sc: Any, settings: Mapping[str, str] | None, python: str | None, actuator: Any = None
) -> Any:
    """A configured listener, not yet added to `sc` (`start_listener` adds it)."""
    gateway, jvm = sc._gateway, sc._jvm
    listener = (
        jar_class(sc, LISTENER_CLASS)
        .getConstructor(gateway.new_array(jvm.java.lang.Class, 0))
        .newInstance(gateway.new_array(jvm.java.lang.Object, 0))
    )
    argv = [python or sys.executable, "-m", "tailguard.observer.relay"]
    command = gateway.new_array(jvm.java.lang.String, len(argv))
    for i, arg in enumerate(argv):
        command[i] = arg
    listener.setCommand(command)
    for key, value in (settings or {}).items():
        listener.setting(str(key), str(value))
    if actuator is not None:
        listener.setActuator(actuator)
    return listener


def start_listener(sc: Any, listener: Any) -> str:
    """Tell `listener` the application and its executors so far, and add it; the app id."""
    jsc = sc._jsc
    app_id: str = sc.applicationId
    now = int(time.time() * 1000)
    listener.attached(now, app_id, sc.appName)
    # Executors that registered before the listener: their hosts are the nodes of every job.
    executors = jsc.sc().statusStore().executorList(True)
    for i in range(executors.size()):
        summary = executors.apply(i)
        host = summary.hostPort().rsplit(":", 1)[0]
        listener.executor(now, summary.id(), host, summary.totalCores())
    jsc.sc().addSparkListener(listener)
    return app_id


def observe(
    spark: Any,
    settings: Mapping[str, str] | None = None,
    *,
    python: str | None = None,
) -> Observation:
    """Attach tailguard's listener to the SparkContext behind `spark` (a SparkSession or a
    SparkContext). Its Spark jobs from now on are published as tailguard jobs.

    `settings` are tailguard settings (as in the TOML file: policy keys, `bootstrap.servers`,
    `tailguard.archive-dir`, ...) over the environment's; `python` runs the relay (default: this
    interpreter).
    """
    sc = spark_context(spark, "observe")
    listener = new_listener(sc, settings, python)
    return Observation(sc, listener, start_listener(sc, listener))
