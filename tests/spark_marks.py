"""Marks for tests that start Spark: `spark` (so `make test-spark35` runs them on PySpark 3.5
too) and a skip with the reason when there is no JDK.

    from tests.spark_marks import SPARK
    pytestmark = SPARK
"""

from __future__ import annotations

import pytest

from tailguard.cluster.local import ClusterError, find_java

try:
    find_java()
    JAVA_MISSING = ""
except ClusterError as exc:
    JAVA_MISSING = str(exc)

needs_java = pytest.mark.skipif(bool(JAVA_MISSING), reason=JAVA_MISSING or "java found")
SPARK = [pytest.mark.spark, needs_java]
