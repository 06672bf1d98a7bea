"""The driver of tests/integration/test_multihost.py, as a user would write it: started by
`spark-submit` inside the driver's network namespace, with the Spark settings and the shipped
environment on the command line (docs/deploy.md's recipe), the session built the usual way.

    spark-submit ... multihost_driver.py PARAMS.json

PARAMS.json: config (the settings file), data, output, workers (their addresses),
task_s, rows_per_split, result (where to write what the test checks).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(params_path: str) -> int:
    from pyspark.sql import SparkSession

    import tailguard
    from tailguard import stack
    from tailguard.agent.executor import environment
    from tailguard.bench.runner import tailguard_job
    from tailguard.bench.scenarios import IoSize
    from tailguard.settings_file import load_settings

    params = json.loads(Path(params_path).read_text())
    spark = SparkSession.builder.appName("tailguard multihost").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        stack.await_executors(spark, params["workers"])
        conf = spark.sparkContext.getConf()
        # What the executors run, asked the way the agent's own check asks (by value).
        from pyspark import cloudpickle

        cloudpickle.register_pickle_by_value(environment)
        slots = 2 * len(params["workers"])
        executors = (
            spark.sparkContext.parallelize(range(slots), slots)
            .mapPartitions(environment.describe)
            .collect()
        )
        io = IoSize(
            files=params["files"],
            rows_per_file=params["rows_per_file"],
            task_s=params["task_s"],
            workers=len(params["workers"]),
        )
        job = tailguard_job("io", Path(params["data"]), Path(params["output"]), 0, io)
        settings = load_settings(params["config"], environ={})
        result = tailguard.run(job, spark, settings=settings, progress=False)
        print(result.summary(), flush=True)
        Path(params["result"]).write_text(
            json.dumps(
                {
                    "ok": result.ok,
                    "message": result.message,
                    "archive": str(result.archive),
                    "sink_parallelism": next(
                        result.parallelism[chain][0]
                        for chain, operators in result.chains.items()
                        if "sink" in operators
                    ),
                    "summary": result.summary(),
                    "driver_host": conf.get("spark.driver.host"),
                    "driver_python": sys.executable,
                    "executors": executors,
                }
            )
        )
        return 0 if result.ok else 1
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
