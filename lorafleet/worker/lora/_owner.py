"""Tags naming the process that owns a temporary directory or an in-use marker.

A tag is ``{host}@{pid}@{token}``; the random token tells a process from an
earlier one that had the same pid (pid 1 in every container, for example).
"""

from __future__ import annotations

import os
import secrets
import socket
from typing import Final

from lorafleet.process.pids import pid_alive

__all__ = ["owner_alive", "owner_tag"]

_HOST: Final = socket.gethostname().replace("@", "_")
_TOKEN: Final = secrets.token_hex(4)


def owner_tag() -> str:
    """Return this process's tag (computed per call, so a forked child gets its own pid)."""
    return f"{_HOST}@{os.getpid()}@{_TOKEN}"


def owner_alive(tag: str) -> bool:
    """Return whether the owner named by ``tag`` may still run (unknown hosts count as alive)."""
    host, _, rest = tag.partition("@")
    pid_text, _, token = rest.partition("@")
    if host != _HOST:
        return True
    if not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return token == _TOKEN
    return pid_alive(pid)
