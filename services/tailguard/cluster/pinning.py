"""Run a piece of work on a chosen host: an RDD whose partitions carry location preferences.

PySpark's `parallelize` cannot attach a preferred host to a partition, but Scala's
`SparkContext.makeRDD(Seq[(T, Seq[String])])` can: it makes one partition per element, each
preferring its hosts. So the RDD is built on the JVM side from (pickled payload, Seq(host))
pairs and wrapped as a Python RDD. With `spark.locality.wait` long (1h) the scheduler waits for
a free slot on the preferred host instead of falling back to another one.

On the Python worker the elements are read with `CPickleSerializer` (length-framed
`pickle.loads`), so each payload is pickled here with cloudpickle: the task receives the
original object (a `bytes` payload arrives as the same `bytes`), and objects whose classes or
functions are defined in `__main__` survive the trip too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pyspark import RDD, SparkContext, cloudpickle
from pyspark.serializers import CPickleSerializer

_dumps: Callable[[Any], bytes] = cloudpickle.dumps  # cloudpickle ships no type hints


def pinned_rdd(sc: SparkContext, items: Sequence[tuple[Any, str]]) -> RDD[Any]:
    """An RDD with one partition per `(payload, host)` item, each preferring its host.

    `pinned_rdd(sc, [(payload, host)]).map(fn).collect()` runs `fn(payload)` on `host`
    (given `spark.locality.wait` long enough and an executor on that host).
    """
    if not items:
        raise ValueError("pinned_rdd needs at least one (payload, host) item")
    jvm = sc._jvm
    assert jvm is not None and sc._jsc is not None
    to_seq = jvm.PythonUtils.toSeq
    pairs = [jvm.scala.Tuple2(_dumps(payload), to_seq([host])) for payload, host in items]
    byte_array_tag = jvm.scala.reflect.ClassTag.apply(jvm.java.lang.Class.forName("[B"))
    jrdd = sc._jsc.sc().makeRDD(to_seq(pairs), byte_array_tag)
    return RDD(jrdd.toJavaRDD(), sc, CPickleSerializer())
