"""Where the JDK's `java` is: `$JAVA_HOME/bin/java`, else `java` on PATH. Spark (the local
cluster) and Apache Kafka's broker (the embedded broker) both run on it; each says what it
needs the JDK for when there is none."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def java_path() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")
