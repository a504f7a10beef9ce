"""A network namespace on a bridge of its own, whose link can be taken down: a real partition.

Unlike ``TcpProxy`` (``tests/faults.py``), a link that is down drops packets silently:
no reset, no refusal, as when a cable or a switch fails between two hosts. Needs root
and ``ip``; ``Netns.create`` raises ``OSError`` where either is missing.
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
