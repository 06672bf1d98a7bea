"""tailguard: an event-sourced control plane for PySpark batch jobs.

    import tailguard
    job = tailguard.Job("sales")
    ...
    result = tailguard.run(job, spark)

`Job` and `run` are imported on first use, so `import tailguard` stays light for the services,
which never need Spark or pyarrow.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["Job", "attach", "ignoring", "observe", "run", "spark_conf"]


def __getattr__(name: str) -> Any:
    if name == "Job":
        from tailguard.agent.graph.api import Job

        return Job
    if name == "run":
        from tailguard.agent.entry import run

        return run
    if name == "observe":
        from tailguard.observer import observe

        return observe
    if name == "ignoring":
        from tailguard.observer import ignoring

        return ignoring
    if name == "attach":
        from tailguard.attacher import attach

        return attach
    if name == "spark_conf":
        from tailguard.attacher import spark_conf

        return spark_conf
    raise AttributeError(f"module 'tailguard' has no attribute {name!r}")
