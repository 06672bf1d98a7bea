"""librdkafka's mock cluster on a port of our choosing, so a restarted broker keeps its address.

Clients know a broker by its bootstrap address and by the address its metadata advertises; after
a crash, a broker on a new port is one they never find again (they retry the old one forever).
librdkafka's mock cluster always binds its listener to a port the kernel picks, and
confluent-kafka exposes no mock API, so this module drives librdkafka's own C API (the copy
confluent-kafka loaded) through ctypes:

1. `rd_kafka_mock_cluster_new` starts a one-broker cluster on a kernel-chosen port;
2. a socket bound to the wanted port takes the place of that listener under the same file
   descriptor (`dup2`): the cluster's I/O thread polls descriptors by number, so from its next
   poll on it accepts connections on the wanted port (a connection made meanwhile waits in the
   backlog);
3. `rd_kafka_mock_broker_set_host_port` makes the metadata advertise that port.

Measured here (librdkafka 2.16): a producer with queued records reconnects to a broker restarted
on the same port within its reconnect backoff and delivers them in order.
"""

from __future__ import annotations

import ctypes
import os
import socket
from dataclasses import dataclass
from pathlib import Path

LOOPBACK = "127.0.0.1"
# The mock cluster's only broker.
_BROKER_ID = 1
_RD_KAFKA_PRODUCER = 0


class ListenerError(RuntimeError):
    """The mock cluster could not be created or moved to the wanted port."""


def _librdkafka() -> ctypes.CDLL:
    """The librdkafka that confluent-kafka loaded (its wheel bundles one with a hashed name;
    a source build links the system's), found in this process's memory map."""
    import confluent_kafka  # noqa: F401  (loads the library whose path we look up)

    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split(maxsplit=5)[-1]
        if "librdkafka" in os.path.basename(path):
            lib = ctypes.CDLL(path)
            break
    else:
        raise ListenerError("librdkafka is not loaded in this process (no /proc/self/maps entry)")
    lib.rd_kafka_conf_new.restype = ctypes.c_void_p
    lib.rd_kafka_conf_set.argtypes = [
        ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
    ]  # fmt: skip
    lib.rd_kafka_new.restype = ctypes.c_void_p
    lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_cluster_new.restype = ctypes.c_void_p
    lib.rd_kafka_mock_cluster_new.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.rd_kafka_mock_cluster_destroy.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_cluster_bootstraps.restype = ctypes.c_char_p
    lib.rd_kafka_mock_cluster_bootstraps.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_mock_broker_set_host_port.argtypes = [
        ctypes.c_void_p, ctypes.c_int32, ctypes.c_char_p, ctypes.c_int,
    ]  # fmt: skip
    return lib


@dataclass
class MockCluster:
    """A one-broker mock cluster held by this process; `close()` ends it (its data with it)."""

    bootstrap: str
    _lib: ctypes.CDLL
    _handle: int
    _cluster: int

    def close(self) -> None:
        if self._cluster:
            self._lib.rd_kafka_mock_cluster_destroy(self._cluster)
            self._lib.rd_kafka_destroy(self._handle)
            self._cluster = self._handle = 0


def start_mock_cluster(port: int = 0) -> MockCluster:
    """A one-broker mock cluster on `LOOPBACK:port` (0: any free port). `OSError` if the port
    is taken."""
    lib = _librdkafka()
    conf = lib.rd_kafka_conf_new()
    error = ctypes.create_string_buffer(512)
    # The handle only holds the cluster: it connects nowhere, so its notices say nothing useful.
    lib.rd_kafka_conf_set(conf, b"log_level", b"3", error, len(error))
    handle = lib.rd_kafka_new(_RD_KAFKA_PRODUCER, conf, error, len(error))
    if not handle:
        raise ListenerError(f"librdkafka handle: {error.value.decode(errors='replace')}")
    cluster = lib.rd_kafka_mock_cluster_new(handle, 1)
    if not cluster:
        lib.rd_kafka_destroy(handle)
        raise ListenerError("librdkafka could not create a mock cluster")
    held = MockCluster(lib.rd_kafka_mock_cluster_bootstraps(cluster).decode(), lib, handle, cluster)
    if port:
        try:
            _move_listener(held, port)
        except BaseException:
            held.close()
            raise
    return held


def _move_listener(held: MockCluster, port: int) -> None:
    host, _, current = held.bootstrap.rpartition(":")
    if int(current) == port:
        return
    replacement = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        # As librdkafka's own listener: a restart may bind while the dead one's
        # connections are still in TIME_WAIT.
        replacement.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        replacement.bind((LOOPBACK, port))
        replacement.listen(64)
        os.dup2(replacement.fileno(), _listening_fd(host, int(current)), inheritable=False)
    finally:
        replacement.close()  # the dup2'd descriptor keeps the socket open
    held._lib.rd_kafka_mock_broker_set_host_port(held._cluster, _BROKER_ID, LOOPBACK.encode(), port)
    held.bootstrap = f"{LOOPBACK}:{port}"


def _listening_fd(host: str, port: int) -> int:
    """The descriptor of this process's socket bound to `host:port`."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            copy = os.dup(fd)
        except OSError:  # closed since it was listed
            continue
        try:
            probe = socket.socket(fileno=copy)
        except OSError:  # not a socket
            os.close(copy)
            continue
        try:
            if probe.family == socket.AF_INET and probe.getsockname() == (host, port):
                return fd
        except OSError:
            pass
        finally:
            probe.close()
    raise ListenerError(f"the mock cluster's listener on {host}:{port} was not found")
