"""Hosts that share nothing but a network, on one machine: Linux network namespaces joined by veth
links to one bridge.

Each host is a network namespace with its own loopback, its own port space and one address on
the bridge's subnet, so a process in it reaches another host only over the bridge, as it would
between machines (they still share the file system and the process table: storage every
executor can reach, and pids the launcher can signal). The root namespace gets the bridge's
own address (`.1`): it is the operator's machine, from which the lab is started, watched (the
Spark master's web UI) and stopped.

    with NamespaceNetwork(["master", "w1", "w2", "driver"]) as net:
        net["w1"].address                       # "10.147.0.3"
        net["w1"].command(["python", "-V"])     # ["ip", "netns", "exec", "tg-w1", ...]

Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2's `ip`; `unavailable()` says why the
lab cannot be built here, for a test to skip with that reason. Namespaces and links carry the
network's `tag` in their names, and a new network first removes what an interrupted one of
the same tag left behind.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType

DEFAULT_SUBNET = "10.147.0.0/24"
DEFAULT_TAG = "tg"
_IFNAME_MAX = 15  # Linux interface names


class NetnsError(RuntimeError):
    """The namespaces or links could not be created (the message names the `ip` command)."""


@dataclass(frozen=True)
class NetnsHost:
    """One host of the lab: its role name, namespace and address."""

    name: str
    namespace: str
    address: str

    def command(self, argv: Sequence[str]) -> list[str]:
        """`argv` run inside this host's namespace (`ip netns exec` keeps the pid: the process
        it starts is the one a Popen of this command returns)."""
        return ["ip", "netns", "exec", self.namespace, *argv]


def _ip(*args: str, namespace: str | None = None, check: bool = True) -> str:
    argv = ["ip", *args] if namespace is None else ["ip", "netns", "exec", namespace, "ip", *args]
    done = subprocess.run(argv, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise NetnsError(f"`{' '.join(argv)}` failed: {done.stderr.strip() or done.returncode}")
    return done.stdout


def unavailable() -> str | None:
    """Why namespaces cannot be created here, or None when they can (tried, then removed)."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces are Linux only (this is {sys.platform})"
    if os.geteuid() != 0:
        return "creating network namespaces needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN)"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed (apt-get install iproute2)"
    probe = f"{DEFAULT_TAG}-probe-{os.getpid()}"
    try:
        _ip("netns", "add", probe)
        _ip("link", "add", f"{DEFAULT_TAG}p{os.getpid() % 100000}", "type", "bridge")
    except NetnsError as err:
        return f"cannot create network namespaces or links here: {err}"
    finally:
        _ip("link", "del", f"{DEFAULT_TAG}p{os.getpid() % 100000}", check=False)
        _ip("netns", "del", probe, check=False)
    return None


class NamespaceNetwork:
    """The hosts `names`, each in its own namespace, on one bridge (see the module doc)."""

    def __init__(
        self, names: Sequence[str], subnet: str = DEFAULT_SUBNET, tag: str = DEFAULT_TAG
    ) -> None:
        if len(set(names)) != len(names) or not names:
            raise ValueError(f"host names must be distinct and at least one: {list(names)}")
        network = ipaddress.ip_network(subnet)
        addresses = list(network.hosts())
        if len(names) + 1 > len(addresses):
            raise ValueError(f"{subnet} has no room for {len(names)} hosts and the bridge")
        self.tag = tag
        self.prefix_len = network.prefixlen
        self.bridge = f"{tag}-br"
        self.gateway = str(addresses[0])
        self.hosts = {
            name: NetnsHost(name, f"{tag}-{name}", str(addresses[i + 1]))
            for i, name in enumerate(names)
        }
        for i, _name in enumerate(names):
            if len(self._veth(i)[1]) > _IFNAME_MAX or len(self.bridge) > _IFNAME_MAX:
                raise ValueError(f"tag {tag!r} makes interface names too long")
        self.created = False

    def __getitem__(self, name: str) -> NetnsHost:
        return self.hosts[name]

    def __iter__(self) -> Iterator[NetnsHost]:
        return iter(self.hosts.values())

    def _veth(self, index: int) -> tuple[str, str]:
        """(the bridge's end, the host's end) of host `index`'s link."""
        return f"{self.tag}-v{index}", f"{self.tag}-h{index}"

    def create(self) -> NamespaceNetwork:
        self.destroy(leftovers=True)
        self.created = True
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.gateway}/{self.prefix_len}", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for index, host in enumerate(self.hosts.values()):
                outer, inner = self._veth(index)
                _ip("netns", "add", host.namespace)
                _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
                _ip("link", "set", inner, "netns", host.namespace)
                _ip("link", "set", outer, "master", self.bridge, "up")
                ns = host.namespace
                _ip("addr", "add", f"{host.address}/{self.prefix_len}", "dev", inner, namespace=ns)
                _ip("link", "set", inner, "up", namespace=ns)
                _ip("link", "set", "lo", "up", namespace=ns)
        except BaseException:
            self.destroy()
            raise
        return self

    def destroy(self, leftovers: bool = False) -> None:
        """Remove the namespaces, links and bridge (deleting a namespace deletes its end of the
        link, and the other end with it). `leftovers`: also what an earlier, interrupted network
        of this tag left, whatever its hosts were."""
        if not (self.created or leftovers):
            return
        namespaces = {h.namespace for h in self.hosts.values()}
        links = {self._veth(i)[0] for i in range(len(self.hosts))}
        if leftovers:
            listed = _ip("netns", "list", check=False).split("\n")
            namespaces |= {line.split()[0] for line in listed if line.startswith(f"{self.tag}-")}
            names = (line.split(":")[1].strip() for line in _ip("-o", "link", check=False)
                     .splitlines() if line.count(":") >= 2)  # fmt: skip
            links |= {name.split("@")[0] for name in names if name.startswith(f"{self.tag}-v")}
        # The bridge's end first: deleting it removes the pair even when the namespace outlives
        # its name (the kernel frees a namespace only when nothing refers to it any more, which
        # after a Spark run was seen to take minutes).
        for link in sorted(links):
            _ip("link", "del", link, check=False)
        for namespace in sorted(namespaces):
            _ip("netns", "del", namespace, check=False)
        _ip("link", "del", self.bridge, check=False)
        self.created = False

    def __enter__(self) -> NamespaceNetwork:
        return self.create()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.destroy()
