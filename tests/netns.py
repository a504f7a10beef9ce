"""Network namespaces as hosts, and links between them that can be cut: real partitions.

``Netns``: one namespace on a bridge of its own, whose link can be taken down.
``Network``: many namespaces on one switch, where the link between any two can be cut,
both ways or one way (the multi-host cluster of ``tests/topology.py``).
Unlike ``TcpProxy`` (``tests/faults.py``), a cut drops packets silently: no reset, no
refusal, as when a cable or a switch fails between two hosts. Needs root and ``ip``
(``Network`` also ``nft``); ``create`` raises ``OSError`` where one is missing.
"""

from __future__ import annotations

import secrets
import subprocess
from dataclasses import dataclass


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise OSError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")


@dataclass(frozen=True)
class Netns:
    """Namespace ``name`` with address ``address``, reached over ``link`` from this host."""

    name: str
    address: str
    bridge: str
    link: str

    @classmethod
    def create(cls) -> Netns:
        """A fresh namespace on 10.27.N.0/24 (N random): the host is .1, the namespace .2."""
        tag = secrets.token_hex(3)
        subnet = f"10.27.{int(tag[:2], 16)}"
        netns = cls(f"lf{tag}", f"{subnet}.2", f"lfbr{tag}", f"lfv{tag}")
        try:
            _ip("netns", "add", netns.name)
            _ip("link", "add", netns.bridge, "type", "bridge")
            _ip("addr", "add", f"{subnet}.1/24", "dev", netns.bridge)
            _ip("link", "set", netns.bridge, "up")
            _ip("link", "add", netns.link, "type", "veth", "peer", "name", "e0",
                "netns", netns.name)  # fmt: skip
            _ip("link", "set", netns.link, "master", netns.bridge, "up")
            _ip("-n", netns.name, "addr", "add", f"{netns.address}/24", "dev", "e0")
            _ip("-n", netns.name, "link", "set", "e0", "up")
            _ip("-n", netns.name, "link", "set", "lo", "up")
        except OSError:
            netns.delete()
            raise
        return netns

    def argv(self, *command: str) -> list[str]:
        """``command`` run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *command]

    def cut(self) -> None:
        """Take the link down: packets both ways are dropped, silently."""
        _ip("link", "set", self.link, "down")

    def heal(self) -> None:
        _ip("link", "set", self.link, "up")

    def delete(self) -> None:
        """Remove the namespace, its link and its bridge (what exists of them)."""
        for args in (("netns", "del", self.name), ("link", "del", self.link),
                     ("link", "del", self.bridge)):  # fmt: skip
            subprocess.run(["ip", *args], capture_output=True)


@dataclass(frozen=True)
class Host:
    """One "host" of a ``Network``: a namespace on the switch, at ``address``."""

    name: str
    netns: str
    address: str

    def argv(self, *command: str) -> list[str]:
        """``command`` run on this host (inside its namespace)."""
        return ["ip", "netns", "exec", self.netns, *command]


class Network:
    """Hosts (namespaces) on one switch, any link between two of which can be cut.

    The switch is a bridge in a namespace of its own, so the host's firewall (Docker's
    ``FORWARD`` policy drop) never sees the frames. A cut is an nft rule on the bridge
    that drops the IP frames from one host to another, silently, as a switch or a
    firewall between two hosts would; ``one_way`` leaves the other direction through.
    ARP still passes. The test process reaches every host over an uplink at ``.1``.
    Needs root, ``ip`` and ``nft``; ``create`` raises ``OSError`` where one is missing.
    """

    def __init__(self, tag: str, subnet: str, names: list[str]) -> None:
        self.switch = f"lfsw{tag}"
        self.uplink = f"lfup{tag}"
        self.subnet = subnet
        self.hosts = {
            name: Host(name, f"lf{tag}-{name}", f"{subnet}.{index + 2}")
            for index, name in enumerate(names)
        }

    @classmethod
    def create(cls, names: list[str]) -> Network:
        """Hosts ``names`` at 10.28.N.2, .3, ... (N random) on a fresh switch."""
        in_use = subprocess.run(["ip", "-4", "addr"], capture_output=True, text=True).stdout
        tag = secrets.token_hex(3)
        while f"10.28.{int(tag[:2], 16)}." in in_use:  # another test's network (parallel runs)
            tag = secrets.token_hex(3)
        network = cls(tag, f"10.28.{int(tag[:2], 16)}", names)
        try:
            network._build()
        except OSError:
            network.delete()
            raise
        return network

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def _build(self) -> None:
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        _ip("link", "add", self.uplink, "type", "veth", "peer", "name", "uplink",
            "netns", self.switch)  # fmt: skip
        _ip("addr", "add", f"{self.subnet}.1/24", "dev", self.uplink)
        _ip("link", "set", self.uplink, "up")
        _ip("-n", self.switch, "link", "set", "uplink", "master", "br0", "up")
        for index, host in enumerate(self.hosts.values()):
            port = f"p{index}"
            _ip("netns", "add", host.netns)
            _ip("-n", host.netns, "link", "add", "e0", "type", "veth", "peer", "name", port,
                "netns", self.switch)  # fmt: skip
            _ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
            _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "e0")
            _ip("-n", host.netns, "link", "set", "e0", "up")
            _ip("-n", host.netns, "link", "set", "lo", "up")
        self._nft("add table bridge lorafleet")
        self._nft("add chain bridge lorafleet forward "
                  "{ type filter hook forward priority 0 ; policy accept ; }")  # fmt: skip

    def cut(self, a: str, b: str, *, one_way: bool = False) -> None:
        """Drop every packet from host ``a`` to host ``b`` and, unless ``one_way``, back."""
        pairs = [(a, b)] if one_way else [(a, b), (b, a)]
        for source, target in pairs:
            self._nft(f"add rule bridge lorafleet forward ip saddr {self[source].address} "
                      f"ip daddr {self[target].address} drop")  # fmt: skip

    def heal(self) -> None:
        """Remove every cut: all links pass again."""
        self._nft("flush chain bridge lorafleet forward")

    def delete(self) -> None:
        """Remove every namespace and the uplink (what exists of them)."""
        for netns in [host.netns for host in self.hosts.values()] + [self.switch]:
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.uplink], capture_output=True)

    def _nft(self, rule: str) -> None:
        done = subprocess.run(["ip", "netns", "exec", self.switch, "nft", *rule.split()],
                              capture_output=True, text=True)  # fmt: skip
        if done.returncode != 0:
            raise OSError(f"nft {rule} failed: {done.stderr.strip()}")
