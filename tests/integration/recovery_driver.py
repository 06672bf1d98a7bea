"""The driver process that tests/integration/test_driver_recovery.py kills with -9:

    python recovery_driver.py JOB_ID DATA OUT SLOW_S SETTINGS_JSON

runs the recovery job on local[2] under JOB_ID with the given settings."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(job_id: str, data: str, out: str, slow_s: str, settings_json: str) -> int:
    sys.path.insert(0, str(Path(__file__).parent))
    import recovery_job
    from pyspark import cloudpickle

    import tailguard
    from tailguard.agent.adapters.spark import session_builder
    from tailguard.model.config import Settings

    cloudpickle.register_pickle_by_value(recovery_job)  # type: ignore[no-untyped-call]
    spark = session_builder("local[2]", app_name="tailguard recovery victim").getOrCreate()
    result = tailguard.run(
        recovery_job.make_job(data, out, float(slow_s)),
        spark,
        settings=Settings(json.loads(settings_json)),
        job_id=job_id,
        progress=False,
    )
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
