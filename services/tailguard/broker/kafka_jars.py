"""Apache Kafka's broker jars, resolved from Maven Central once and cached.

`kafka_classpath()` returns the directory of jars to run `kafka.Kafka` from:
`<cache>/kafka-<version>/libs`, where `<cache>` is `$TAILGUARD_CACHE_DIR`, else
`$XDG_CACHE_HOME/tailguard`, else `~/.cache/tailguard`. The first call resolves
`org.apache.kafka:kafka_2.13:<version>` with its runtime dependencies (plus log4j's binding for
the SLF4J API the broker logs through) by running Maven's `dependency:copy-dependencies`; later
calls find the directory and start nothing.

Why Maven rather than the Ivy resolver inside the pyspark wheel: the broker is needed where
pyspark is not installed (`tailguard[services]`), Maven reads Kafka's published POMs exactly as
Kafka's own build declares them (scopes, exclusions), and its local repository (`~/.m2`) is
shared with any other Maven use on the machine. It is one `apt-get install maven` away
(`.ci/run` does it) and runs on the JDK 17 Spark needs anyway.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

KAFKA_VERSION = "4.1.1"
SCALA_VERSION = "2.13"
# The SLF4J binding Kafka's distribution ships (its POM leaves the choice to the user).
LOG4J_VERSION = "2.24.3"
# Pinned so that a resolution today and one in a year run the same plugin.
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>tailguard</groupId>
  <artifactId>embedded-kafka-broker</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_{scala}</artifactId>
      <version>{kafka}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j-impl</artifactId>
      <version>{log4j}</version>
    </dependency>
  </dependencies>
</project>
"""


class JarsError(RuntimeError):
    """Kafka's jars could not be resolved; the message says why and what to do."""


def cache_dir() -> Path:
    configured = os.environ.get("TAILGUARD_CACHE_DIR")
    if configured:
        return Path(configured)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "tailguard"


def kafka_classpath(
    report: Callable[[str], None] = lambda _: None, version: str = KAFKA_VERSION
) -> Path:
    """The directory holding the broker's jars, resolved now if not cached yet."""
    home = cache_dir() / f"kafka-{version}"
    libs = home / "libs"
    if libs.is_dir():
        return libs
    home.mkdir(parents=True, exist_ok=True)
    # Two first starts at once (two test sessions) resolve once: the second waits for the first.
    with (home / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not libs.is_dir():
            _resolve(home, libs, version, report)
    return libs


def _resolve(home: Path, libs: Path, version: str, report: Callable[[str], None]) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarsError(
            "Maven (`mvn`) is not installed: it resolves Apache Kafka's jars from Maven Central "
            "once (`apt-get install maven`). Without network access, `tailguard broker up "
            "--mock` runs librdkafka's in-memory mock instead (docs/log.md)."
        )
    report(
        f"resolving Apache Kafka {version} (org.apache.kafka:kafka_{SCALA_VERSION}) from Maven "
        f"Central with Maven, once; cached in {home}"
    )
    staging = Path(tempfile.mkdtemp(prefix=".resolving.", dir=home))
    pom = staging / "pom.xml"
    pom.write_text(_POM.format(scala=SCALA_VERSION, kafka=version, log4j=LOG4J_VERSION))
    log = home / "maven.log"
    with log.open("w") as out:
        done = subprocess.run(
            [
                mvn, "-B", "-f", str(pom),
                f"{DEPENDENCY_PLUGIN}:copy-dependencies",
                "-DincludeScope=runtime",
                f"-DoutputDirectory={staging / 'libs'}",
            ],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, check=False,
        )  # fmt: skip
    if done.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise JarsError(
            f"Maven could not resolve Apache Kafka {version} (exit {done.returncode}; whole "
            f"output in {log}):\n{tail}\nWithout access to Maven Central, `tailguard broker up "
            "--mock` runs librdkafka's in-memory mock instead."
        )
    # Renamed into place whole, so a directory that exists is a complete resolution.
    (staging / "libs").rename(libs)
    shutil.rmtree(staging, ignore_errors=True)
    report(f"Apache Kafka {version}: {len(list(libs.glob('*.jar')))} jars in {libs}")
