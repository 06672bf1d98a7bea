"""The fleet blocklist in the forms a platform uses when it submits a job.

Observe mode cannot keep a native Spark job's tasks off a host while the job runs (Spark
schedules them; docs/observe.md). What it can do is hand the list to the next submission:

- `yarn`: `spark.yarn.exclude.nodes=h1,h2` (a `--conf` value or a spark-defaults.conf line;
  SPARK-26688, which without dynamic allocation needs Spark 3.4+, SPARK-41585);
- `k8s`: a pod template with a required node affinity `kubernetes.io/hostname NotIn [hosts]`,
  for `spark.kubernetes.driver.podTemplateFile` / `spark.kubernetes.executor.podTemplateFile`;
- `hosts`: one host per line, for anything else.

The formatters are pure; `tailguard blocklist export --format yarn|k8s|hosts` reads the
compacted `tailguard.blocklist` topic (the blocks in force now: `blocklist/cli.py`, the one reader
of the list) and prints one; `python -m tailguard.observer export` is the same command. They live
with the blocklist, below observe mode, which calls them (`blocklist/cli.py` imports this file,
so this file imports nothing of tailguard's).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Sequence

FORMATS = ("yarn", "k8s", "hosts")
YARN_EXCLUDE_KEY = "spark.yarn.exclude.nodes"
HOSTNAME_LABEL = "kubernetes.io/hostname"
# A host name or an address: what a YARN node list and a Kubernetes label value can carry. A
# comma or a space would silently split one entry into two in the YARN list.
_HOST = re.compile(r"^[A-Za-z0-9_.:\-\[\]]+$")


class ExportError(ValueError):
    """A host the target format cannot carry, named."""


def _checked(hosts: Sequence[str]) -> list[str]:
    for host in hosts:
        if not _HOST.match(host):
            raise ExportError(f"host {host!r} cannot be exported: not a host name or address")
    return sorted(set(hosts))


def yarn(hosts: Sequence[str]) -> str:
    return f"{YARN_EXCLUDE_KEY}={','.join(_checked(hosts))}\n"


def k8s(hosts: Sequence[str]) -> str:
    """A pod template; with no host blocked, one without affinity (Kubernetes refuses NotIn
    with an empty list)."""
    checked = _checked(hosts)
    if not checked:
        return "apiVersion: v1\nkind: Pod\nspec: {}\n"
    values = "".join(f"                - {json.dumps(h)}\n" for h in checked)
    return (
        "apiVersion: v1\n"
        "kind: Pod\n"
        "spec:\n"
        "  affinity:\n"
        "    nodeAffinity:\n"
        "      requiredDuringSchedulingIgnoredDuringExecution:\n"
        "        nodeSelectorTerms:\n"
        "          - matchExpressions:\n"
        f"              - key: {HOSTNAME_LABEL}\n"
        "                operator: NotIn\n"
        "                values:\n"
        f"{values}"
    )


def host_list(hosts: Sequence[str]) -> str:
    return "".join(f"{h}\n" for h in _checked(hosts))


FORMATTERS: dict[str, Callable[[Sequence[str]], str]] = {
    "yarn": yarn,
    "k8s": k8s,
    "hosts": host_list,
}


def export_hosts(form: str, hosts: Sequence[str], command: str) -> int:
    """Print `hosts` in `form`; the exit status (1: a host the form cannot carry, named)."""
    try:
        sys.stdout.write(FORMATTERS[form](hosts))
    except ExportError as err:
        print(f"{command}: {err}", file=sys.stderr)
        return 1
    return 0
