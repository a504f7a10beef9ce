"""What a shutdown must not wait for: clients that never finish a request, a hung etcd."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Final

from lorafleet.launch.local_servers import LocalServer
from tests.processes import ServiceProcess

EXIT_MARGIN_S: Final = 5.0
"""Issue 13: after SIGTERM a process exits within its grace period plus this."""


@contextlib.contextmanager
def stuck_clients(port: int, *, idle: int, slow_path: str) -> Iterator[list[socket.socket]]:
    """``idle`` connections that never send a byte, and one that sends the headers of a
    POST with ``Content-Length: 100`` to ``slow_path`` and no body; closed on the way out."""
    sockets = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(idle)]
    slow = socket.create_connection(("127.0.0.1", port), timeout=30)
    sockets.append(slow)
    try:
        slow.sendall(
            f"POST {slow_path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Content-Length: 100\r\n\r\n".encode()
        )
        yield sockets
    finally:
        for sock in sockets:
            sock.close()


@contextlib.contextmanager
def hung(server: LocalServer) -> Iterator[None]:
    """The server process stopped (SIGSTOP): connections stay open, nothing answers."""
    os.kill(server.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.pid, signal.SIGCONT)


def served_after(service: ServiceProcess, path: str = "/health") -> None:
    """One complete request on a fresh connection: the server has read what came before."""
    with contextlib.suppress(urllib.error.HTTPError):
        urllib.request.urlopen(f"{service.url}{path}", timeout=30).close()


def stop_by_signal(
    service: ServiceProcess, grace_s: float, signum: int = signal.SIGTERM
) -> tuple[int, float]:
    """Send ``signum``; return the exit code and the seconds until the process was gone."""
    started = time.monotonic()
    service.process.send_signal(signum)
    code = service.process.wait(grace_s + EXIT_MARGIN_S + 30)
    return code, time.monotonic() - started


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (reads EOF or a reset before its timeout)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def exits_within_grace_despite_stuck_clients_and_hung_etcd(
    service: ServiceProcess, etcd: LocalServer, *, grace_s: float, slow_path: str, stopping: str
) -> None:
    """Hold 500 idle connections and a POST to ``slow_path`` without its body, hang etcd,
    send SIGTERM: the process exits 0 within ``grace_s`` plus the margin, having logged
    ``stopping`` (it must log JSON, ``LOG_FORMAT=json``). Kills ``service`` in any case."""
    try:
        with stuck_clients(service.port, idle=500, slow_path=slow_path):
            served_after(service)
            with hung(etcd):
                code, took_s = stop_by_signal(service, grace_s=grace_s)
    finally:
        service.kill()
    assert code == 0
    assert took_s < grace_s + EXIT_MARGIN_S
    lines = [json.loads(line) for line in service.log_path.read_text().splitlines()]
    assert stopping in [line["event"] for line in lines]
