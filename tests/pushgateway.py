"""A real Pushgateway for the tests (Debian's prometheus-pushgateway), on a free port."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

BINARY = shutil.which("prometheus-pushgateway") or shutil.which("pushgateway")
MISSING = "" if BINARY else "no Pushgateway binary: apt-get install prometheus-pushgateway"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running_pushgateway(log_dir: Path, timeout_s: float = 30.0) -> Iterator[str]:
    """Start one; yields its URL once it says it is ready, stops it on exit."""
    assert BINARY is not None, MISSING
    address = f"127.0.0.1:{free_port()}"
    log_path = log_dir / "pushgateway.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [BINARY, f"--web.listen-address={address}"], stdout=log, stderr=subprocess.STDOUT
        )
        url = f"http://{address}"
        try:
            deadline = time.monotonic() + timeout_s
            while not _ready(url):  # its readiness endpoint is the only signal it gives
                assert process.poll() is None, log_path.read_text()
                assert time.monotonic() < deadline, "the Pushgateway did not become ready"
                time.sleep(0.05)
            yield url
        finally:
            process.terminate()
            process.wait(timeout=10)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False
