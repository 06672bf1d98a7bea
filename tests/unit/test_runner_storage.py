"""A slot runner takes its object-storage settings from its driver, over their authenticated
connection: a real `multiprocessing.connection` pair in this process, the runner `serve`s in a
thread. (That the driver sends them before any Deploy, and that executors then reach S3 with
credentials that exist only in the driver's settings, is tests/integration/test_s3.py.)"""

from __future__ import annotations

import pickle
import secrets
import threading
from collections.abc import Iterator
from multiprocessing.connection import Listener

import pytest

from tailguard import filesystems
from tailguard.agent.executor.protocol import (
    ConfigureStorage,
    RunnerHello,
    Shutdown,
    receive,
    send,
)
from tailguard.agent.executor.runner import RunnerConfig, serve
from tailguard.filesystems import S3Options

SECRET_KEY = "secret-that-stays-out-of-repr"


@pytest.fixture(autouse=True)
def unconfigured() -> Iterator[None]:
    filesystems.configure(None)
    yield
    filesystems.configure(None)


def test_the_runner_configures_storage_from_its_driver() -> None:
    job_secret = secrets.token_bytes(32)
    options = S3Options("http://127.0.0.1:9000", "eu-west-1", True, "AKIAEXAMPLE", SECRET_KEY)
    with Listener(("127.0.0.1", 0), family="AF_INET", authkey=job_secret) as listener:
        address = listener.address
        assert isinstance(address, tuple)
        config = RunnerConfig(address, job_secret, "h1/r1", "h1", "test")
        served: list[str] = []
        thread = threading.Thread(target=lambda: served.append(serve(config)), daemon=True)
        thread.start()
        with listener.accept() as conn:
            assert isinstance(receive(conn), RunnerHello)
            message = ConfigureStorage(options)
            assert SECRET_KEY not in repr(message)
            send(conn, message)
            send(conn, Shutdown("done"))
            thread.join(10)
    assert not thread.is_alive() and served == ["shut down by the driver: done"]
    assert filesystems.configured_s3() == options
    fs, inner = filesystems.open_location("s3a://bucket/k")
    assert fs.region == "eu-west-1" and inner == "bucket/k"


def test_the_message_carries_the_credentials_only_when_pickled_for_the_runner() -> None:
    message = ConfigureStorage(S3Options(region="r", access_key="AK", secret_key=SECRET_KEY))
    # It must reach the runner, so the pickle holds it; what is shown of it does not.
    assert SECRET_KEY.encode() in pickle.dumps(message)
    assert SECRET_KEY not in repr(message) and SECRET_KEY not in str(message)
    assert pickle.loads(pickle.dumps(message)) == message
