"""Log lines for operators: plain text or JSON (`--log-format json`), with job and record ids.

- JSON is python-json-logger's formatter: one object per line with `time`, `level`, `logger`,
  `message`, the process's `service` (the services), and whatever the code attached with
  `extra=` (`record_id`, `caused_by`, `topic`, ...).
- `job_id` is attached to every line logged inside `job_context(job_id)` (the agent wraps a
  job's run in it) unless the line names its own (`extra={"job_id": ...}`, the services, which
  serve many jobs). Threads a job starts do not inherit a context variable, so a line from one
  of them gets the job id too when it is the only job running in the process: the usual case
  of one driver, one job.
- Secrets never appear: an `extra` field whose name is a secret's (`model.config.is_secret`)
  is redacted, and once the settings are known (`hide_secrets`) any secret value found in a
  formatted line, message or traceback, is replaced by `<redacted>`.
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import json
import logging
import sys
import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import IO, Any

from pythonjsonlogger.json import JsonFormatter

from tailguard.model.config import REDACTED, is_secret

LOG_FORMATS = ("text", "json")

# Secret values shorter than this are not searched for in log lines: replacing every "abc"
# would garble the log and protect nothing a short secret does not already give away.
MIN_SECRET_LENGTH = 4

_JOB: contextvars.ContextVar[str | None] = contextvars.ContextVar("tailguard_job", default=None)
_running: Counter[str] = Counter()
_running_lock = threading.Lock()

# What every LogRecord has: anything else on a record came from `extra=` or a filter.
_STANDARD_ATTRIBUTES = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


def add_format_argument(parser: argparse.ArgumentParser, default: Any = None) -> None:
    """`--log-format text|json`. A subcommand that repeats the top-level option passes
    `argparse.SUPPRESS`, so that its absence does not undo `tailguard --log-format json ...`."""
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=default,
        help="log lines as plain text or one JSON object per line, with job and record ids "
        "(docs/operations.md#logs)",
    )


@contextlib.contextmanager
def job_context(job_id: str) -> Iterator[None]:
    """Every line logged inside (on this thread, or on any while it is the only job) names
    `job_id`."""
    token = _JOB.set(job_id)
    with _running_lock:
        _running[job_id] += 1
    try:
        yield
    finally:
        _JOB.reset(token)
        with _running_lock:
            _running[job_id] -= 1
            if _running[job_id] <= 0:
                del _running[job_id]


def current_job() -> str | None:
    job = _JOB.get()
    if job is not None:
        return job
    with _running_lock:
        return next(iter(_running)) if len(_running) == 1 else None


class _JobAndSecretsFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "job_id", None) is None:
            job = current_job()
            if job is not None:
                record.job_id = job
        for name in list(record.__dict__):
            if name not in _STANDARD_ATTRIBUTES and is_secret(name):
                setattr(record, name, REDACTED)
        return True


class _TextFormatter(logging.Formatter):
    """The classic line, with the ids appended when the line has them."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        ids = [
            f"{name}={getattr(record, name)}"
            for name in ("job_id", "record_id")
            if getattr(record, name, None) is not None
        ]
        return f"{line} [{' '.join(ids)}]" if ids else line


class _SecretScrubber(logging.Formatter):
    """Wraps a formatter; replaces each known secret value in what it produced."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner
        self.secrets: tuple[str, ...] = ()

    def add_secrets(self, values: Mapping[str, str]) -> None:
        """Hide these settings' secret values too (once known, a secret stays hidden)."""
        found = set(self.secrets)
        for key, value in values.items():
            if is_secret(key) and value and len(value) >= MIN_SECRET_LENGTH:
                found.add(value)
                found.add(json.dumps(value)[1:-1])  # as it appears inside a JSON string
        # Longest first, so a secret that contains another is replaced whole.
        self.secrets = tuple(sorted(found, key=len, reverse=True))

    def format(self, record: logging.LogRecord) -> str:
        line = self.inner.format(record)
        for secret in self.secrets:
            line = line.replace(secret, REDACTED)
        return line


def formatter(log_format: str, service: str | None = None) -> logging.Formatter:
    if log_format == "json":
        return JsonFormatter(
            "%(levelname)s %(name)s %(message)s",
            rename_fields={"levelname": "level", "name": "logger"},
            timestamp="time",  # ISO 8601, UTC, with milliseconds
            static_fields={"service": service} if service else None,
        )
    if log_format == "text":
        who = f" {service}" if service else ""
        return _TextFormatter(f"%(asctime)s{who} %(levelname)s %(name)s: %(message)s")
    raise ValueError(f"unknown log format {log_format!r}; choose one of {', '.join(LOG_FORMATS)}")


def configure(
    log_format: str,
    *,
    service: str | None = None,
    level: int = logging.INFO,
    stream: IO[str] | None = None,
) -> logging.Handler:
    """Send log lines to `stream` (stderr) in `log_format`: tailguard's from `level` up, other
    libraries' from WARNING up. Replaces what an earlier call installed; returns the handler."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.set_name("tailguard")
    handler.setFormatter(_SecretScrubber(formatter(log_format, service)))
    handler.addFilter(_JobAndSecretsFilter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == "tailguard"]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("tailguard").setLevel(level)
    return handler


def hide_secrets(settings: Mapping[str, str], handler: logging.Handler | None = None) -> None:
    """From now on, no line the handler (default: the one `configure` installed, if any)
    writes shows the value of a secret setting."""
    handlers = [handler] if handler is not None else logging.getLogger().handlers
    for candidate in handlers:
        if isinstance(candidate.formatter, _SecretScrubber):
            candidate.formatter.add_secrets(settings)
