"""Check that the ports ``lorafleet up`` needs are free, and name what holds a taken one.

Checked before anything starts, so that a second cluster never talks to the first.
Must not pick replacement ports: the caller decides (etcd and NATS may move, the
HTTP ports a user typed may not).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Final

from lorafleet.launch.errors import PortInUseError

__all__ = ["holder", "is_free", "require_free"]

COMMAND_CHARS: Final = 80
"""How much of the holder's command line an error shows."""


def is_free(port: int) -> bool:
    """Whether nothing listens on ``port`` of 127.0.0.1 or of all interfaces.

    Asks as uvicorn, etcd and NATS bind, with ``SO_REUSEADDR``: connections of a run
    that just stopped (TIME_WAIT, about 60 s) do not hold the port, only a listener does.
    """
    for host in ("127.0.0.1", "0.0.0.0"):
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((host, port))
            except OSError:
                return False
    return True


def require_free(ports: dict[str, int]) -> None:
    """Raise ``PortInUseError`` for the first taken port of ``ports`` (role → port)."""
    for role, port in ports.items():
        if not is_free(port):
            raise PortInUseError(port=port, role=role, holder=holder(port))


def holder(port: int) -> str:
    """``"pid 123 (python3 -m http.server)"`` for the listener on ``port``, if visible."""
    inodes = _listening_inodes(port)
    if not inodes:
        return ""
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and _holds_socket(proc, inodes):
            return f"pid {proc.name} ({_command(proc)})"
    return ""


def _listening_inodes(port: int) -> set[str]:
    listen_state = "0A"
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == listen_state and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def _holds_socket(proc: Path, inodes: set[str]) -> bool:
    try:
        links = [os.readlink(fd) for fd in (proc / "fd").iterdir()]
    except OSError:  # another user's process, or it just exited
        return False
    return any(link.startswith("socket:[") and link[8:-1] in inodes for link in links)


def _command(proc: Path) -> str:
    try:
        argv = (proc / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    command = " ".join(arg.decode(errors="replace") for arg in argv if arg)
    return " ".join(command.split())[:COMMAND_CHARS]
