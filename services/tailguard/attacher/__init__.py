"""Attach mode: the services' decisions applied to an unmodified Spark application.

    import tailguard
    attachment = tailguard.attach(spark)     # any running SparkSession or SparkContext
    ... the job, unchanged ...
    attachment.close()                        # or just spark.stop()

or with no code at all (docs/attach.md):

    spark-submit --jars "$(python -m tailguard.observer jar)" \\
      --conf spark.plugins=tailguard.attach.AttachPlugin \\
      --conf spark.sql.extensions=tailguard.attach.AttachExtensions job.py

Observe mode's listener and relay carry Spark's task events to the services, as in observe mode;
in attach mode the relay also takes the services' commands about the application's jobs, checks
them as the owned driver does (signature, authority, once per id, a guard against the
application's state: `observer/command_guards.py`, `observer/actuation.py`, on the relay's
thread), and hands each to the JVM actuator
(`observer/java/tailguard/attach/Actuator.java`), which applies it inside Spark's scheduler under
the scheduler's own lock. Every command is answered with `CommandApplied` or `CommandRejected`.
SetParallelism reaches the query stages adaptive query execution plans through a query-stage
rule (`spark.sql.extensions`, which must be set when the session starts: `spark_conf()` sets
it; `observer/query_plans.py`).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import Any

from tailguard.model.config import is_secret
from tailguard.observer import (
    Observation,
    jar_class,
    listener_jar,
    new_listener,
    spark_context,
    start_listener,
)
from tailguard.observer.jar import ACTUATOR_CLASS, EXTENSIONS_CLASS, PLUGIN_CLASS

__all__ = ["Attachment", "attach", "spark_conf"]
_log = logging.getLogger(__name__)

PLUGINS_KEY = "spark.plugins"
EXTENSIONS_KEY = "spark.sql.extensions"
# Spark's conf prefix for tailguard settings (the listener reads them, prefix dropped).
SETTINGS_PREFIX = "spark.tailguard."
HEARTBEAT_KEY = "spark.executor.heartbeatInterval"
HEARTBEAT = "2s"


class Attachment(Observation):
    """An attached application: `pause()`, `resume()` and `close()` as for `observe`; while
    paused, nothing is observed and so nothing is decided or applied."""

    started_by_plugin = False


class _PluginAttachment(Attachment):
    """The session was built with the plugin: the application has been attached since it
    started, and stays so until it stops (the relay ends with it)."""

    started_by_plugin = True

    def __init__(self, sc: Any) -> None:
        super().__init__(sc, None, sc.applicationId)
        self._attached = False

    def pause(self, timeout_s: float = 60.0) -> None:
        raise RuntimeError(
            f"attached by {PLUGIN_CLASS} for the whole application: it cannot be paused"
        )

    def resume(self) -> None:
        raise RuntimeError(
            f"attached by {PLUGIN_CLASS} for the whole application: it cannot be resumed"
        )

    def close(self, timeout_s: float = 60.0) -> int:
        return 0  # the plugin's relay ends with the application


def _plugin_configured(sc: Any) -> bool:
    plugins = sc.getConf().get(PLUGINS_KEY, "") or ""
    return PLUGIN_CLASS in [p.strip() for p in plugins.split(",")]


def attach(
    spark: Any,
    settings: Mapping[str, str] | None = None,
    *,
    python: str | None = None,
) -> Attachment:
    """Attach tailguard to the SparkContext behind `spark`: its Spark jobs from now on are
    published as tailguard jobs, and the services' commands about them are applied.

    `settings` are tailguard settings (as in the TOML file) over the environment's; `python`
    runs the relay (default: this interpreter). A session built with `spark_conf()` (the
    plugin) is attached already: this returns a handle to that attachment.
    """
    sc = spark_context(spark, "attach")
    if _plugin_configured(sc):
        _log.info("attach: %s attached this application when it started", PLUGIN_CLASS)
        return _PluginAttachment(sc)
    gateway, jvm = sc._gateway, sc._jvm
    types = gateway.new_array(jvm.java.lang.Class, 1)
    types[0] = sc._jsc.sc().getClass()
    args = gateway.new_array(jvm.java.lang.Object, 1)
    args[0] = sc._jsc.sc()
    actuator = jar_class(sc, ACTUATOR_CLASS).getConstructor(types).newInstance(args)
    # Without the query-stage rule (spark.sql.extensions is read when the session starts) the
    # actuator turns SetParallelism off, and the relay says so once.
    listener = new_listener(sc, settings, python, actuator)
    return Attachment(sc, listener, start_listener(sc, listener))


def spark_conf(
    settings: Mapping[str, str] | None = None, *, python: str | None = None
) -> dict[str, str]:
    """The Spark settings that attach an application when it starts, for a
    `SparkSession.builder` (`.config(map=...)`) or `spark-submit --conf`s.

    tailguard settings become `spark.tailguard.<key>`. A secret (a signing key, a password) is
    refused: Spark shows its configuration in the UI and the event log; give secrets through
    the environment (`TAILGUARD_*`) or the settings file instead.
    """
    secret = sorted(k for k in settings or {} if is_secret(k))
    if secret:
        raise ValueError(
            f"{secret}: a secret must not travel in Spark's configuration (the UI and the event "
            f"log show it); set it in the environment (TAILGUARD_*) or the settings file"
        )
    conf = {
        "spark.jars": str(listener_jar()),
        PLUGINS_KEY: PLUGIN_CLASS,
        # The query-stage rule (SetParallelism). A session with extensions of its own lists
        # both, comma-separated.
        EXTENSIONS_KEY: EXTENSIONS_CLASS,
        f"{SETTINGS_PREFIX}observe.python": python or sys.executable,
        # A running task's reads reach the detector with each executor heartbeat; the slow-host
        # rule needs three of them, so Spark's 10 s would take half a minute to find a host.
        HEARTBEAT_KEY: HEARTBEAT,
    }
    conf.update({f"{SETTINGS_PREFIX}{k}": str(v) for k, v in (settings or {}).items()})
    return conf
