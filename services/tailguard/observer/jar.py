"""tailguard's jar: the listener, the actuator and the plugin, compiled from the Java sources
shipped in the package, once per source and Spark version.

The jar is built on demand with the machine's `javac` against the Spark jars of the installed
pyspark (the same Spark the job runs on), and cached under a name that carries the hash of the
source and of the Spark version, so an upgrade of either builds a new one. A jar is a zip file:
`zipfile` writes it, no `jar` tool needed. Building takes ~6 s on this 2-core machine; later
calls return the cached path at once.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

LISTENER_CLASS = "tailguard.observe.TaskEventListener"
ACTUATOR_CLASS = "tailguard.attach.Actuator"
PLUGIN_CLASS = "tailguard.attach.AttachPlugin"
EXTENSIONS_CLASS = "tailguard.attach.AttachExtensions"
# Every class of the jar: the listener (observe), the actuator and the plugin (attach).
_SOURCES = tuple(sorted((Path(__file__).parent / "java").rglob("*.java")))


class JarBuildError(RuntimeError):
    """The listener could not be compiled: names the missing tool or javac's message."""


def spark_home() -> Path:
    import pyspark

    home = os.environ.get("SPARK_HOME")
    return Path(home) if home else Path(pyspark.__file__).parent


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tailguard"


def listener_jar(directory: Path | None = None) -> Path:
    """The path of the listener's jar, compiled first if this source and Spark have none yet."""
    import pyspark

    source = b"".join(p.read_bytes() for p in _SOURCES)
    digest = hashlib.blake2b(source + pyspark.__version__.encode(), digest_size=8).hexdigest()
    target = (directory or cache_dir()) / f"tailguard-observe-{digest}.jar"
    if target.exists():
        return target
    javac = shutil.which("javac")
    if javac is None:
        raise JarBuildError(
            "`javac` not found: observe mode compiles its Spark listener with a JDK 17 "
            "(apt-get install openjdk-17-jdk-headless), or pass a jar built elsewhere"
        )
    jars = spark_home() / "jars"
    if not jars.is_dir():
        raise JarBuildError(f"no Spark jars at {jars}: set SPARK_HOME to the Spark installation")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tailguard-observe-") as tmp:
        done = subprocess.run(
            [javac, "--release", "17", "-nowarn", "-cp", f"{jars}/*", "-d", tmp]
            + [str(p) for p in _SOURCES],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            names = ", ".join(p.name for p in _SOURCES)
            raise JarBuildError(f"javac failed on {names}:\n{done.stderr.strip()}")
        partial = target.with_suffix(f".{os.getpid()}.part")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as jar:
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\n\r\n")
            for path in sorted(Path(tmp).rglob("*.class")):
                jar.write(path, path.relative_to(tmp).as_posix())
        # Atomic: a concurrent builder or a reader never sees half a jar.
        partial.replace(target)
    return target
