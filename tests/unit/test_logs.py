"""Log lines (`tailguard.logs`): JSON objects with the job and record ids, the text format, the job
of a thread the job started, secrets never shown, and `--log-format` on the command line."""

from __future__ import annotations

import argparse
import io
import json
import logging
import threading
from collections.abc import Iterator

import pytest

from tailguard import cli, logs
from tailguard.model.config import REDACTED

SECRET = 'hunter2-"quoted"-secret'
SETTINGS = {"kafka.sasl.password": SECRET, "bootstrap.servers": "kafka:9092", "s3.secret-key": "ab"}
log = logging.getLogger("tailguard.test")


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root, ours = logging.getLogger(), logging.getLogger("tailguard")
    handlers, levels = list(root.handlers), (root.level, ours.level)
    yield
    root.handlers[:] = handlers
    root.setLevel(levels[0])
    ours.setLevel(levels[1])


def lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_json_line_carries_the_job_the_record_and_the_service(restore_logging: None) -> None:
    stream = io.StringIO()
    logs.configure("json", service="decider", stream=stream)
    with logs.job_context("job-1"):
        log.info("decided %s", "x", extra={"record_id": "decider-1", "caused_by": ["job-1-e8"]})
    log.info("between jobs")
    (inside, outside) = lines(stream)
    assert inside["message"] == "decided x"
    assert (inside["level"], inside["logger"], inside["service"]) == (
        "INFO",
        "tailguard.test",
        "decider",
    )
    assert (inside["job_id"], inside["record_id"], inside["caused_by"]) == (
        "job-1",
        "decider-1",
        ["job-1-e8"],
    )
    assert inside["time"].endswith("+00:00")  # ISO 8601, UTC
    assert "job_id" not in outside


def test_a_line_naming_its_own_job_keeps_it(restore_logging: None) -> None:
    stream = io.StringIO()
    logs.configure("json", stream=stream)
    with logs.job_context("job-1"):
        log.info("about another job", extra={"job_id": "job-2"})
    assert lines(stream)[0]["job_id"] == "job-2"


def test_a_thread_the_job_started_names_it_while_it_is_the_only_job(
    restore_logging: None,
) -> None:
    stream = io.StringIO()
    logs.configure("json", stream=stream)

    def from_a_thread() -> None:
        thread = threading.Thread(target=log.warning, args=("from a thread",))
        thread.start()
        thread.join()

    with logs.job_context("job-1"):
        from_a_thread()
        with logs.job_context("job-2"):  # two jobs running: a thread's line is nobody's
            from_a_thread()
    first, second = lines(stream)
    assert first["job_id"] == "job-1"
    assert "job_id" not in second
    assert logs.current_job() is None


def test_no_secret_value_reaches_a_line(restore_logging: None) -> None:
    stream = io.StringIO()
    handler = logs.configure("json", stream=stream)
    logs.hide_secrets(SETTINGS, handler)
    log.warning("connecting with %s", SECRET, extra={"kafka_password": "x" * 8, "note": SECRET})
    try:
        raise ValueError(f"bad credentials {SECRET!r}")
    except ValueError:
        log.exception("failed")
    text = stream.getvalue()
    assert SECRET not in text and json.dumps(SECRET)[1:-1] not in text
    warning, failure = lines(stream)
    assert warning["message"] == f"connecting with {REDACTED}"
    assert warning["kafka_password"] == REDACTED and warning["note"] == REDACTED
    assert REDACTED in failure["exc_info"]
    # A two-letter secret is not searched for: every "ab" in the log would go.
    log.info("about the tab")
    assert lines(stream)[-1]["message"] == "about the tab"


def test_the_text_format_appends_the_ids(restore_logging: None) -> None:
    stream = io.StringIO()
    handler = logs.configure("text", service="blocklist", stream=stream)
    logs.hide_secrets(SETTINGS, handler)
    with logs.job_context("job-1"):
        log.info("blocked h1 with %s", SECRET, extra={"record_id": "blocklist-1"})
    line = stream.getvalue().strip()
    assert " blocklist INFO tailguard.test: blocked h1 with <redacted>" in line
    assert line.endswith("[job_id=job-1 record_id=blocklist-1]")


def test_configuring_again_replaces_the_handler_and_other_libraries_stay_quiet(
    restore_logging: None,
) -> None:
    first, second = io.StringIO(), io.StringIO()
    logs.configure("text", stream=first)
    logs.configure("json", stream=second)
    log.info("once")
    logging.getLogger("py4j.clientserver").info("chatter")
    logging.getLogger("py4j.clientserver").warning("a warning")
    assert first.getvalue() == ""
    assert [line["message"] for line in lines(second)] == ["once", "a warning"]
    with pytest.raises(ValueError, match="unknown log format 'xml'"):
        logs.formatter("xml")


def test_log_format_goes_before_or_after_the_subcommand() -> None:
    parser = cli.build_parser()
    from tailguard.shell import services_cli

    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    services_cli.add_arguments(sub.choices["services"])
    before = parser.parse_args(["--log-format", "json", "services", "up"])
    after = parser.parse_args(["services", "up", "--log-format", "json"])
    neither = parser.parse_args(["services", "up"])
    assert before.log_format == after.log_format == "json"
    assert neither.log_format is None
    with pytest.raises(SystemExit):
        parser.parse_args(["--log-format", "yaml", "services", "up"])


def test_a_secret_once_known_stays_hidden(restore_logging: None) -> None:
    stream = io.StringIO()
    logs.configure("text", stream=stream)
    logs.hide_secrets(SETTINGS)  # the handler `configure` installed
    logs.hide_secrets({"s3.secret-key": "second-job-secret"})
    log.warning("%s and %s", SECRET, "second-job-secret")
    assert stream.getvalue().split(": ", 1)[1].strip() == f"{REDACTED} and {REDACTED}"
