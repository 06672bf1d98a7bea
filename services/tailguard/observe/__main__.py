"""`python -m tailguard.observe jar`: the listener's jar path, for `spark-submit --jars`."""

from __future__ import annotations

import sys

from tailguard.observe.jar import JarBuildError, listener_jar

USAGE = "usage: python -m tailguard.observe jar"


def main(argv: list[str]) -> int:
    if argv != ["jar"]:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        print(listener_jar())
    except JarBuildError as exc:
        print(f"tailguard observe: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
