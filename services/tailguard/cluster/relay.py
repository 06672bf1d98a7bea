"""A TCP relay: accept on one address, connect each client through to another.

Why the namespace lab needs it: the embedded broker (librdkafka's mock cluster) binds and
advertises 127.0.0.1 only — the address is fixed in librdkafka (`rd_kafka_mock_broker_new`
binds INADDR_LOOPBACK), and of the `test.mock.*` settings only `num.brokers` and `broker.rtt`
exist. In the broker's namespace a relay listens on the host's address and forwards to the
broker's loopback port; in every client's namespace a relay listens on that same loopback
port and forwards to the broker host. A client then bootstraps from "127.0.0.1:<port>", is told
the broker is at "127.0.0.1:<port>", and every byte crosses the namespace network both ways.

    python -m tailguard.cluster.relay --listen 10.147.0.3:41234 --to 127.0.0.1:41234

It prints `relay ready <listen> -> <to>` once listening, and runs until terminated.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys

READY = "relay ready"
_CHUNK = 64 * 1024


def _address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError):
            writer.close()


async def serve(listen: tuple[str, int], target: tuple[str, int]) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    server = await asyncio.start_server(handle, *listen)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    print(f"{READY} {listen[0]}:{listen[1]} -> {target[0]}:{target[1]}", flush=True)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tailguard.cluster.relay")
    parser.add_argument("--listen", type=_address, required=True, metavar="HOST:PORT")
    parser.add_argument("--to", type=_address, required=True, metavar="HOST:PORT")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.listen, args.to))
    return 0


if __name__ == "__main__":
    sys.exit(main())
