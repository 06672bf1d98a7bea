"""Spark's UI is on, and a tailguard job's Spark jobs show there under readable names; its
typed archive reads with the JVM's Avro library (the one spark-avro and avro-tools are built on)
and with `spark.read.format("avro")` (spark-avro, resolved from Maven Central by Spark's own
`spark.jars.packages`).

One local-mode job (no services), then what Spark itself says about it: the status tracker's
job group, the UI's REST API (the data the UI's pages show), the caller's thread left as it
was. Sessions of parallel tests take the next free UI port, so the address comes from
`sc.uiWebUrl`.
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from tests.spark_marks import SPARK

from tailguard.examples import sales_by_region
from tailguard.model.config import Settings
from tailguard.testing import Harness

MAVEN_CENTRAL = "https://repo1.maven.org/maven2"


def spark_avro_package() -> str:
    """spark-avro's Maven coordinates for the installed PySpark: its Scala line and version from
    the name of the wheel's spark-core jar (spark-core_2.13-4.3.0.jar). Where Maven Central has
    no spark-avro of that version, the newest release of the same major line before it (Maven
    Central's newest Spark here is 4.2.0, the wheel's 4.3.0)."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    [core] = [
        m
        for j in jars.glob("spark-core_*.jar")
        if (m := re.match(r"spark-core_(.+)-(.+)\.jar", j.name))
    ]
    scala, version = core.groups()
    artifact = f"org/apache/spark/spark-avro_{scala}"
    with urllib.request.urlopen(f"{MAVEN_CENTRAL}/{artifact}/maven-metadata.xml", timeout=30) as f:
        published = re.findall(r"<version>([0-9.]+)</version>", f.read().decode())

    def key(v: str) -> tuple[int, ...]:
        return tuple(int(x) for x in v.split("."))

    same_line = [v for v in published if v.split(".")[0] == version.split(".")[0]]
    chosen = max(v for v in same_line if key(v) <= key(version))
    return f"org.apache.spark:spark-avro_{scala}:{chosen}"


pytestmark = SPARK


@pytest.fixture(scope="module")
def spark(tailguard_harness: Harness, request: pytest.FixtureRequest) -> Any:
    """The pytest plugin's local[2] session (PySpark allows one per process), with spark-avro,
    which Spark's own `spark.jars.packages` resolves from Maven Central (once: ~/.ivy2*)."""
    return tailguard_harness.spark(None, [("spark.jars.packages", spark_avro_package())])


@pytest.fixture(scope="module")
def finished(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tailguard.agent.entry import run

    tmp = tmp_path_factory.mktemp("spark-ui")
    data = sales_by_region.generate(tmp / "sales", files=2, rows_per_file=1_000)
    settings = Settings(
        {"tailguard.work-dir": str(tmp / "work"), "tailguard.archive-dir": str(tmp / "archive")}
    )
    job = sales_by_region.make_job(data, tmp / "out")
    result = run(job, spark, log_mode="archive", services=False, settings=settings, progress=False)
    assert result.ok, result.summary()
    return job, result


def ui_json(spark: Any, path: str) -> Any:
    sc = spark.sparkContext
    with urllib.request.urlopen(
        f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}/{path}", timeout=60
    ) as reply:
        return json.loads(reply.read())


def test_the_ui_is_on_unless_the_user_turns_it_off(spark: Any) -> None:
    from tailguard.agent.adapters.spark import session_builder

    url = spark.sparkContext.uiWebUrl
    assert url and url.startswith("http://")
    with urllib.request.urlopen(f"{url}/jobs/", timeout=60) as reply:
        assert reply.status == 200
    # The builder leaves the setting alone, so the user's spark-defaults.conf,
    # PYSPARK_SUBMIT_ARGS or own .config() decide.
    assert "spark.ui.enabled" not in session_builder("local[2]")._options


def test_runner_jobs_show_under_the_jobs_group_and_readable_descriptions(
    spark: Any, finished: Any
) -> None:
    from tailguard.agent.adapters.spark import job_group

    job, result = finished
    group = job_group(result.job_id)
    tracked = set(spark.sparkContext.statusTracker().getJobIdsForGroup(group))
    shown = {j["jobId"]: j for j in ui_json(spark, "jobs") if j.get("jobGroup") == group}
    assert tracked and tracked == set(shown)
    descriptions = sorted(j["description"] for j in shown.values())
    runners = [d for d in descriptions if d.startswith("slot runner")]
    assert f"executor environment check for {job.name}" in descriptions
    # Local mode: one host, one runner per core; numbered in launch order.
    assert runners == [f"slot runner localhost #{n} for {job.name}" for n in (1, 2)]
    assert all(shown[i]["status"] == "SUCCEEDED" for i in tracked)


def test_the_callers_thread_keeps_its_own_job_group(spark: Any, finished: Any) -> None:
    # The executor check ran on this thread: a Spark job the user runs next is not tailguard's.
    sc = spark.sparkContext
    assert sc.getLocalProperty("spark.jobGroup.id") is None
    assert sc.getLocalProperty("spark.job.description") is None
    assert not sc.getJobTags()


def test_the_jvms_avro_library_reads_the_typed_archive(spark: Any, finished: Any) -> None:
    """The JVM's Avro, which spark-avro and avro-tools build on, reads the records."""
    _, result = finished
    jvm = spark.sparkContext._jvm
    reader = jvm.org.apache.avro.file.DataFileReader(
        jvm.java.io.File(str(result.archive)), jvm.org.apache.avro.generic.GenericDatumReader()
    )
    seen = []
    try:
        while reader.hasNext():
            entry = reader.next()
            record = entry.get("record")
            seen.append((entry.get("type").toString(), record.getSchema().getName()))
            assert record.get("job_id").toString() == result.job_id
    finally:
        reader.close()
    assert seen and all(kind == branch for kind, branch in seen)
    kinds = {kind for kind, _ in seen}
    assert {"JobSubmitted", "AttemptDeploying", "AttemptFinished", "JobFinished"} <= kinds


_NO_SPARK_AVRO = ("AVRO_DATA_SOURCE_NOT_ENABLED", "Failed to find data source: avro")


def test_spark_reads_the_typed_archive_with_spark_avro(spark: Any, finished: Any) -> None:
    from tailguard.codec.record_union import current_union

    _, result = finished
    try:
        frame = spark.read.format("avro").load(str(result.archive))
    except Exception as err:
        # Spark 4 names the missing module with an error class, Spark 3.5 in plain words.
        if not any(sign in str(err) for sign in _NO_SPARK_AVRO):
            raise
        # PySpark allows one JVM per process: one started earlier in the run (the whole suite)
        # lacks spark-avro on its classpath. `make test` runs this test in a process of its own.
        pytest.skip("this process's JVM started without spark-avro: run this test alone")
    member = [s.record_type.__name__ for s in current_union()].index("JobSubmitted")
    rows = frame.where("type = 'JobSubmitted'").select(f"record.member{member}.name").collect()
    assert [row[0] for row in rows] == [finished[0].name]
