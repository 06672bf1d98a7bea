"""`tailguard broker up|down|status`: the embedded broker, Apache Kafka (or `--mock`).

The same verbs as `tailguard cluster` and `tailguard services`: `up` starts it in the background
(`--foreground`: in this terminal until Ctrl-C), `down` stops it (`--purge`: and deletes its
data), `status` exits 0 while it runs and 1 otherwise; `acls` prints the `kafka-acls.sh`
commands that give an existing cluster the ACLs of docs/security.md. `up --mock` starts librdkafka's
in-memory mock cluster instead, for a machine that cannot reach Maven Central. The spellings from
before (`tailguard broker`, `--stop`, `--status`) still work and say what replaces them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tailguard.broker.embedded import EmbeddedBroker
from tailguard.broker.mock_process import serve
from tailguard.kafka.bootstrap import BrokerError
from tailguard.kafka.broker_state import BrokerState, read_state
from tailguard.processes.signals import stop_on_signals
from tailguard.settings_file import load_settings

IN_MEMORY_NOTE = (
    "note: the mock broker keeps its data in memory only (at most the newest ~5 MB per "
    "partition); everything on it is lost when it stops. The durable log is the per-job Avro "
    "archive."
)
ON_DISK_NOTE = (
    "Apache Kafka, one node (KRaft); its log is kept in {data} across `down` and `up` "
    "(`tailguard broker down --purge` deletes it)"
)


def _note(state: BrokerState, work_dir: Path) -> str:
    from tailguard.broker.kafka_server import DATA_DIR, kafka_dir

    if state.kind == "kafka":
        return ON_DISK_NOTE.format(data=kafka_dir(work_dir) / DATA_DIR)
    return IN_MEMORY_NOTE


ACTIONS = ("up", "down", "status", "acls")
KAFKA_ACLS = 'kafka-acls.sh --bootstrap-server "$KAFKA" --command-config admin.properties'
# The spellings before the verbs, and the verb each one means now.
_OLD_FLAGS = {"stop": "down", "status": "status"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        nargs="?",
        choices=ACTIONS,
        help="up: start in the background (or in this terminal with --foreground); down: stop "
        "it; status: exit 0 while it runs, 1 otherwise; acls: print the kafka-acls.sh commands "
        "that give your cluster the ACLs `up --secure` creates",
    )
    parser.add_argument(
        "--foreground", action="store_true", help="with up: run in this terminal until Ctrl-C"
    )
    parser.add_argument(
        "--work-dir",
        metavar="DIR",
        help="where the state file broker.json and the broker's data live (default: setting "
        "tailguard.work-dir)",
    )
    parser.add_argument(
        "--mock",
        action="store_true",
        help="with up: librdkafka's in-memory mock cluster instead of Apache Kafka (offline; "
        "no data kept, no compaction, no SASL)",
    )
    parser.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help="with up: where Kafka listens and what it advertises (default: where it listened "
        "last, else a free port on 127.0.0.1)",
    )
    parser.add_argument(
        "--secure",
        action="store_true",
        help="with up: Kafka with SASL_SSL (SCRAM-SHA-512, a CA and certificate made here), one "
        "principal per role and the ACLs of docs/security.md; a broker made so stays so",
    )
    parser.add_argument(
        "--purge", action="store_true", help="with down: also delete the broker's data"
    )
    for flag in _OLD_FLAGS:
        parser.add_argument(f"--{flag}", action="store_true", help=argparse.SUPPRESS)


def _action(args: argparse.Namespace) -> str:
    """The verb asked for, saying so where it was asked for the old way."""
    old = [flag for flag in _OLD_FLAGS if getattr(args, flag)]
    if args.action is not None and not old:
        return str(args.action)
    if len(old) > 1 or (old and args.action is not None):
        print("tailguard broker: give one of up, down, status", file=sys.stderr)
        raise SystemExit(2)  # a usage error, as argparse exits for one
    action = _OLD_FLAGS[old[0]] if old else "up"
    given = f"--{old[0]}" if old else "no action"
    instead = f"{action} --foreground" if args.foreground else action
    print(
        f"note: `tailguard broker` with {given} is deprecated: use `tailguard broker {instead}`",
        file=sys.stderr,
    )
    return action


def run(args: argparse.Namespace) -> int:
    action = _action(args)
    if action == "acls":
        from tailguard.broker.acls import acl_commands

        print("# the ACLs of docs/security.md; tailguard-admin (or your admin) is the super user")
        for line in acl_commands():
            print(f"{KAFKA_ACLS} {line}")
        return 0
    settings = load_settings(getattr(args, "config", None))
    work_dir = Path(args.work_dir or settings.get("tailguard.work-dir", "") or "work")
    configured = settings.get("bootstrap.servers", "").strip()
    if configured and action == "up":
        print(
            f"note: bootstrap.servers is set ({configured}): tailguard's clients use that "
            "cluster, not the embedded broker"
        )
    if args.secure and args.mock:
        print("tailguard broker: --secure is Apache Kafka's; the mock has no SASL or TLS")
        return 2
    broker = EmbeddedBroker(
        work_dir,
        mock=args.mock,
        listen=args.listen,
        report=lambda line: print(line, flush=True),
        secure=args.secure,
    )
    try:
        if action == "status":
            return _status(broker)
        if action == "down":
            return _down(broker, purge=args.purge)
        if args.foreground and args.mock:
            return _foreground(broker, work_dir)
        was_running = broker.status()
        if args.foreground and was_running is not None:
            print(f"a broker is already running (pid {was_running.pid}) at {was_running.bootstrap}")
            return 1
        crashed = None if was_running is not None else read_state(work_dir)
        bootstrap = broker.start()
        state = broker.status()
        assert state is not None  # started or found running
        verb = "already running" if was_running is not None else "started"
        print(f"embedded broker {verb} (pid {state.pid}), state file {broker.state_file}")
        print(bootstrap)
        if was_running is not None and (state.kind == "mock") != args.mock:
            print(f"note: the running broker is {_kind(state)}; stop it to start the other one")
        if crashed is not None:
            print(_after_crash(crashed, bootstrap))
        print(_note(state, work_dir))
        _print_logins(work_dir)
        if args.foreground:
            return _hold(broker, state)
        print("stop it with: tailguard broker down")
        return 0
    except BrokerError as err:
        print(f"error: {err}")
        return 1


def _print_logins(work_dir: Path) -> None:
    """A secured broker's client settings: what to give each role (never a password)."""
    from tailguard.broker.acls import AGENT, principals
    from tailguard.broker.kafka_server import kafka_dir
    from tailguard.broker.secure import PASSWORD_ENV, existing

    secured = existing(kafka_dir(work_dir).resolve())
    if secured is None:
        return
    print("secured: SASL_SSL with SCRAM-SHA-512; clients need these settings:")
    for key, value in secured.settings(AGENT).items():
        if key != "kafka.sasl.username":
            print(f"  {key} = {value!r}")
    print(f"  kafka.sasl.username = one of {', '.join(principals())}")
    print(
        f"  and its password from a file: {PASSWORD_ENV}="
        f"{secured.password_file(AGENT).parent}/<username> (owner-only files)"
    )


def _kind(state: BrokerState) -> str:
    return "Apache Kafka" if state.kind == "kafka" else "the mock (librdkafka, in memory)"


def _down(broker: EmbeddedBroker, *, purge: bool) -> int:
    state = broker.status()
    if broker.stop(purge=purge):
        assert state is not None
        kept = "its data is gone" if state.kind == "mock" or purge else "its data is kept"
        print(f"stopped the embedded broker (pid {state.pid}); {kept}")
    else:
        print(f"no embedded broker running under {broker.work_dir}")
        if purge:
            print("its data (if any) is deleted")
    return 0


def _hold(broker: EmbeddedBroker, state: BrokerState) -> int:
    """`up --foreground` with Kafka: the broker runs until Ctrl-C or SIGTERM, then stops."""
    stop = stop_on_signals()
    print(f"running in the foreground (pid {state.pid}); Ctrl-C stops it", flush=True)
    stop.wait()
    broker.stop()
    print("stopped; its data is kept")
    return 0


def _after_crash(crashed: BrokerState, bootstrap: str) -> str:
    """What an operator must know after restarting a broker that died."""
    if crashed.bootstrap == bootstrap:
        lost = (
            "the records it held are gone (docs/log.md#mock-broker-restarts)"
            if crashed.kind == "mock"
            else "it recovered its log from disk"
        )
        return (
            f"the broker before (pid {crashed.pid}) died: this one listens on its address, so "
            f"its clients reconnect by themselves; {lost}"
        )
    return (
        f"warning: the broker before (pid {crashed.pid}) listened on {crashed.bootstrap}, which "
        "could not be had again: restart its clients (services, running jobs) to reach this one"
    )


def _status(broker: EmbeddedBroker) -> int:
    state = broker.status()
    if state is None:
        print(f"no embedded broker running under {broker.work_dir}")
        return 1
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(state.started_at))
    print(
        f"embedded broker running ({_kind(state)}): pid {state.pid}, bootstrap {state.bootstrap}, "
        f"started {started}"
    )
    print(_note(state, broker.work_dir))
    return 0


def _foreground(broker: EmbeddedBroker, work_dir: Path) -> int:
    running = broker.status()
    if running is not None:
        print(f"a broker is already running (pid {running.pid}) at {running.bootstrap}")
        return 1

    def announce(state: BrokerState) -> None:
        print(f"embedded broker running in the foreground (pid {state.pid}); Ctrl-C stops it")
        print(state.bootstrap)
        print(IN_MEMORY_NOTE, flush=True)

    stop = stop_on_signals()
    # A state file left by a crashed broker: listen where its clients look.
    crashed = read_state(work_dir)
    code = serve(work_dir, stop, on_ready=announce, port=crashed.port if crashed else 0)
    print("stopped; the broker's data is gone")
    return code
