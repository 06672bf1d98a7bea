"""tailguard across hosts that share nothing but a network (issue 10).

The Spark master, two workers, the driver, the broker and the services each run in a network
namespace of their own on this machine (`tailguard.cluster.netns`), joined by veth links to one
bridge: no two of them share a loopback, and each has its own address. The driver is started by
`spark-submit` with docs/deploy.md's recipe: the executors run a **shipped** environment (a
packed venv through `--archives ...#environment`, `spark.pyspark.python=./environment/bin/
python`), never the driver's venv. One worker is slow (I/O-mode slowness, 10x); the job runs
with the services on, speculation, blocking and a sink commit, and its output must be exact.

What is not as on separate machines, and why:
- The file system is shared: result partitions and the sink live on it, as on a shared store
  every executor reaches (docs/data-plane.md), and the shipped environment's `bin/python`
  links to this machine's base interpreter (venv-pack ships no interpreter).
- Nothing: the broker (Apache Kafka, `tailguard broker up --listen`) listens on its
  namespace's address and advertises it, and the driver and the services bootstrap from that
  address, as from a Kafka host of their own. (The mock broker binds and advertises 127.0.0.1
  only, and TCP relays carried it between the namespaces; Kafka needs none.)

Long (a cold run packs the environment: ~3.6 min on a loaded 2-core machine, then cached under
work/multihost/env keyed by the packages and the tailguard build, and a code change repacks in
~40 s; a warm run takes ~85 s, and a fresh clone is always cold), so it runs with
`make test-multihost` (TAILGUARD_MULTIHOST=1). The first test, the namespace network
alone (~1 s), runs in the default suite. Everything skips with the reason where namespaces
cannot be created (not root, no `ip`, no CAP_NET_ADMIN).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tailguard.cluster import netns
from tailguard.cluster.netns import NamespaceNetwork, NetnsHost

REPO = Path(__file__).resolve().parents[2]
NETNS_MISSING = netns.unavailable()
LONG = os.environ.get("TAILGUARD_MULTIHOST") != "1"
SLOW_FACTOR = 10.0
WORKERS = ("w1", "w2")
HOSTS = ("master", *WORKERS, "broker", "services", "driver")
IO_VERTEX = "io"  # tailguard.bench.runner.IO_VERTEX: the vertex whose tasks wait
POLICY = {
    "slow-task-detector.check-interval": "250 ms",
    "slow-task-detector.execution-time.baseline-lower-bound": "1 s",
    "execution.batch.speculative.block-slow-node-duration": "20 s",
    "blocklist.min-slow-attempts": "1",
    "execution.batch.adaptive.auto-parallelism.avg-data-volume-per-task": "16 KiB",
    "execution.batch.adaptive.auto-parallelism.max-parallelism": "16",
    "decider.timeout": "5 s",
    "failover.timeout": "5 s",
}
# 8 splits of 1 s of (healthy-host) wait each: 4 slots on two 2-core workers.
DATA = {"files": 4, "rows_per_file": 2_000, "task_s": 1.0}

needs_netns = pytest.mark.skipif(NETNS_MISSING is not None, reason=str(NETNS_MISSING))


def _serve_once_in(host: NetnsHost, port: int) -> subprocess.Popen[str]:
    """A server in `host` on all its addresses (loopback included) that answers one client."""
    code = (
        "import socket\n"
        "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        f"s.bind(('0.0.0.0', {port})); s.listen(); print('ready', flush=True)\n"
        "c, _ = s.accept(); c.sendall(b'hello'); c.close()\n"
    )
    proc = subprocess.Popen(
        host.command([sys.executable, "-c", code]), stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def _connect_from(host: NetnsHost, address: str, port: int) -> str:
    code = (
        "import socket, sys\n"
        f"try: print(socket.create_connection(({address!r}, {port}), 5).recv(5).decode())\n"
        "except OSError as e: print(type(e).__name__)\n"
    )
    done = subprocess.run(
        host.command([sys.executable, "-c", code]), capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


@pytest.mark.skipif(NETNS_MISSING is not None, reason=str(NETNS_MISSING))
def test_namespace_hosts_share_no_loopback_and_reach_each_other_by_address() -> None:
    with NamespaceNetwork(["a", "b"], subnet="10.147.1.0/24", tag="tgt") as net:
        a, b = net["a"], net["b"]
        server = _serve_once_in(a, 5000)
        try:
            # b's loopback is b's own: nothing of a's is there.
            assert _connect_from(b, "127.0.0.1", 5000) == "ConnectionRefusedError"
            assert _connect_from(b, a.address, 5000) == "hello"
        finally:
            server.kill()
            server.wait()
        addresses = subprocess.run(
            ["ip", "-n", b.namespace, "-o", "-4", "addr"], capture_output=True, text=True
        ).stdout
        assert sorted(line.split()[3] for line in addresses.splitlines()) == [
            "10.147.1.3/24",
            "127.0.0.1/8",
        ]
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "tgt-a" not in listed and "tgt-b" not in listed  # removed again


# --------------------------------------------------------------------------- the whole system


@dataclass
class Lab:
    work: Path
    net: NamespaceNetwork
    cluster: Any
    slow_host: str
    data: Path
    output: Path
    settings: Any
    result: dict[str, Any]
    driver_log: Path


def _tailguard(*args: str) -> list[str]:
    return [sys.executable, "-m", "tailguard.cli", *args]


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    if NETNS_MISSING is not None:
        pytest.skip(NETNS_MISSING)
    if LONG:
        pytest.skip("long (minutes): run it with `make test-multihost` (TAILGUARD_MULTIHOST=1)")
    from tailguard.agent.packed_env import packed_environment
    from tailguard.broker.embedded import EmbeddedBroker
    from tailguard.cluster.local import LocalCluster, Node, spark_home
    from tailguard.examples import sales_by_region as example
    from tailguard.settings_file import load_settings
    from tailguard.shell import supervisor

    # Kept after the run for its logs (logs/driver.log, cluster/logs, services/, broker/).
    work = REPO / "work" / "multihost" / "last-run"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    started = time.monotonic()

    def took(what: str) -> None:
        print(f"[multihost] {what} at {time.monotonic() - started:.1f} s", flush=True)

    archive = packed_environment(REPO / "work" / "multihost" / "env", print)
    took("environment packed")
    with ExitStack() as stop:
        net = stop.enter_context(NamespaceNetwork(list(HOSTS)))
        cluster = LocalCluster(
            cores=2,
            memory="1g",
            work_dir=work / "cluster",
            master_node=Node.in_namespace(net["master"]),
            worker_nodes=[Node.in_namespace(net[w]) for w in WORKERS],
            progress=print,
        )
        cluster.start()
        stop.callback(cluster.stop)
        took("Spark master and workers registered")

        # The broker in its namespace, listening on that namespace's address and advertising it.
        broker_dir = work / "broker"
        listen = f"{net['broker'].address}:0"
        subprocess.run(
            net["broker"].command(
                _tailguard("broker", "up", "--work-dir", str(broker_dir), "--listen", listen)
            ),
            check=True,
            capture_output=True,
        )
        stop.callback(EmbeddedBroker(broker_dir).stop)
        state = EmbeddedBroker(broker_dir).status()
        assert state is not None and state.kind == "kafka", state
        assert state.bootstrap.startswith(f"{net['broker'].address}:"), state.bootstrap
        logs = work / "logs"
        logs.mkdir()

        config = work / "tailguard.toml"
        values = {
            **POLICY,
            "bootstrap.servers": state.bootstrap,
            "tailguard.work-dir": str(work / "driver"),
            "tailguard.archive-dir": str(work / "driver" / "archive"),
        }
        config.write_text("".join(f'"{k}" = "{v}"\n' for k, v in sorted(values.items())))
        services_dir = work / "services"
        services_up = ("services", "up", "--work-dir", str(services_dir))
        subprocess.run(
            net["services"].command(_tailguard("--config", str(config), *services_up)),
            check=True,
            capture_output=True,
        )
        stop.callback(supervisor.stop, services_dir, report=print)
        took("broker and services ready")

        data = example.generate(
            work / "data", files=DATA["files"], rows_per_file=DATA["rows_per_file"]
        )
        slow = net[WORKERS[-1]].address
        cluster.throttle(slow, SLOW_FACTOR, mode="io")
        output = work / "out"
        params = work / "params.json"
        result_path = work / "result.json"
        params.write_text(
            json.dumps(
                {
                    **DATA,
                    "config": str(config),
                    "data": str(data),
                    "output": str(output),
                    "workers": [net[w].address for w in WORKERS],
                    "result": str(result_path),
                }
            )
        )
        driver = net["driver"]
        submit = [
            str(spark_home() / "bin" / "spark-submit"),
            "--master", cluster.master_url,
            "--archives", f"{archive}#environment",
            "--conf", "spark.pyspark.python=./environment/bin/python",
            "--conf", f"spark.pyspark.driver.python={sys.executable}",
            "--conf", f"spark.driver.host={driver.address}",
            "--conf", "spark.task.maxFailures=1",
            "--conf", "spark.speculation=false",
            "--conf", "spark.locality.wait=1h",
            "--conf", "spark.ui.enabled=false",
            str(REPO / "tests" / "integration" / "multihost_driver.py"),
            str(params),
        ]  # fmt: skip
        env = {
            key: value
            for key, value in os.environ.items()
            if key not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_LOCAL_IP")
        }
        env["SPARK_HOME"] = str(spark_home())
        driver_log = logs / "driver.log"
        with driver_log.open("w") as out:
            done = subprocess.run(
                driver.command(submit), env=env, stdout=out, stderr=subprocess.STDOUT, timeout=600
            )
        took(f"driver done (exit {done.returncode})")
        assert result_path.is_file(), (
            f"the driver wrote no result (exit {done.returncode}): {driver_log.read_text()[-3000:]}"
        )
        settings = load_settings(config, environ={})
        yield Lab(
            work,
            net,
            cluster,
            slow,
            data,
            output,
            settings,
            json.loads(result_path.read_text()),
            driver_log,
        )


@pytest.fixture(scope="module")
def log(lab: Lab) -> list[Any]:
    from tailguard.replay.inputs import read_archive

    return [item.record for item in read_archive(Path(lab.result["archive"]), lab.settings)]


@pytest.mark.spark
@pytest.mark.slow
@needs_netns
def test_the_job_succeeds_with_exact_output_and_a_committed_sink(lab: Lab) -> None:
    from tailguard.examples import sales_by_region as example

    print(lab.result["summary"])
    assert lab.result["ok"], lab.result["message"] + lab.driver_log.read_text()[-3000:]
    expected = example.reference(lab.data)
    actual = example.read_output(lab.output)
    assert actual[expected.columns.tolist()].equals(expected), "output differs from pandas"
    parts = sorted(p.name for p in lab.output.glob("part-*.parquet"))
    assert len(parts) == lab.result["sink_parallelism"]
    assert (lab.output / "_SUCCESS").is_file()


@pytest.mark.spark
@pytest.mark.slow
@needs_netns
def test_executors_ran_the_shipped_environment_not_the_drivers(lab: Lab) -> None:
    workers = {lab.net[w].address for w in WORKERS}
    executors = lab.result["executors"]
    assert {e["host"] for e in executors} == workers
    for executor in executors:
        assert "error" not in executor, executor
        assert executor["python"].endswith("/environment/bin/python"), executor
        assert "/environment/lib/" in executor["tailguard_path"], executor
        assert not executor["tailguard_path"].startswith(str(REPO / "services")), executor
        assert executor["python"] != lab.result["driver_python"]


@pytest.mark.spark
@pytest.mark.slow
@needs_netns
def test_executors_reached_the_driver_only_over_the_namespace_network(
    lab: Lab, log: list[Any]
) -> None:
    from tailguard.model import records as r

    driver = lab.net["driver"].address
    assert lab.result["driver_host"] == driver
    workers = {lab.net[w].address for w in WORKERS}
    # Every slot the job had was a runner that connected to the driver's address from a
    # worker namespace, whose only interfaces are its loopback and its link to the bridge.
    assert {e.host for e in log if isinstance(e, r.NodeAdded)} == workers
    assert {e.host for e in log if isinstance(e, r.AttemptDeploying)} <= workers
    for w in WORKERS:
        addresses = subprocess.run(
            ["ip", "-n", lab.net[w].namespace, "-o", "-4", "addr"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert sorted(line.split()[3] for line in addresses.splitlines()) == sorted(
            ["127.0.0.1/8", f"{lab.net[w].address}/{lab.net.prefix_len}"]
        )


@pytest.mark.spark
@pytest.mark.slow
@needs_netns
def test_the_slow_worker_is_speculated_around(lab: Lab, log: list[Any]) -> None:
    from tailguard.model import records as r

    findings = [f for f in log if isinstance(f, r.SlowTasksDetected) and f.slow]
    assert any(
        a.host == lab.slow_host for f in findings for s in f.slow for a in s.live_attempts
    ), "the detector found no slow attempt on the slow worker"
    copies = [d for d in log if isinstance(d, r.AttemptDeploying) and d.speculative]
    assert copies, "no speculative attempt ran"
    assert all(c.host != lab.slow_host for c in copies)
    assert all(c.command_id and c.command_id.startswith("speculator-") for c in copies)
    won = {(f.vertex, f.subtask, f.attempt) for f in log if isinstance(f, r.AttemptFinished)} & {
        (c.vertex, c.subtask, c.attempt) for c in copies
    }
    print(f"speculative copies {len(copies)}, won {len(won)}")
