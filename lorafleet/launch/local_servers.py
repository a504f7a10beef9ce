"""Start local etcd and NATS servers from the pip-installed binaries, on free ports.

Used by the test fixtures, the benchmarks and ``lorafleet up``; no Docker needed.
Each server gets its own data directory and log file and is stopped by PID; it dies
with the process that started it (``process.parent_death``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

from lorafleet.process.parent_death import die_with_parent

if TYPE_CHECKING:
    from lorafleet.launch.tls_files import TlsFiles

__all__ = [
    "EtcdMemberArgs",
    "LocalServer",
    "etcd_member_args",
    "find_binary",
    "free_port",
    "launch",
    "nats_cluster_size",
    "start_etcd",
    "start_nats",
    "start_nats_cluster",
    "stop_process",
    "wait_healthy",
]

START_TIMEOUT_S: Final = 15.0
STOP_TIMEOUT_S: Final = 5.0
_POLL_INTERVAL_S: Final = 0.05


@dataclass
class LocalServer:
    """A running server process: its client URL, data directory and log file."""

    name: str
    url: str
    port: int
    data_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes]
    restart_args: list[str]
    health_url: str = ""
    """Plain-HTTP ``/health`` of an etcd (its metrics listener); empty for NATS."""
    env: dict[str, str] = field(default_factory=dict, repr=False)
    """Extra environment of the server (e.g. the passwords its config file reads)."""
    log_start: int = 0
    """Where this run's lines begin in ``log_path`` (a data dir's log is appended to)."""

    @property
    def pid(self) -> int:
        """The server's process id."""
        return self.process.pid

    def stop(self, *, kill: bool = False) -> None:
        """Stop the server by PID (SIGTERM, or SIGKILL when ``kill``), waiting for it to exit."""
        stop_process(self.process, kill=kill)

    def restart(self) -> None:
        """Start the server again on the same port with the same data directory."""
        self.stop()
        self.start_again()

    def start_again(self) -> None:
        """Start the stopped server again (same port, same data) and wait until healthy."""
        restarted = launch(self.name, self.restart_args, self.data_dir, self.url,
                           health_url=self.health_url, env=self.env)  # fmt: skip
        self.process = restarted.process
        wait_healthy(self)


def stop_process(
    process: subprocess.Popen[bytes], *, kill: bool = False, timeout_s: float = STOP_TIMEOUT_S
) -> None:
    """SIGTERM (or SIGKILL) a child and wait; SIGKILL it if it outlives ``timeout_s``."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout_s)


PORT_ATTEMPTS: Final = 3
"""Free ports a server is started on before its start-up error is raised."""


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def find_binary(name: str) -> Path:
    """Find ``name`` next to this Python (the venv's bin) or on PATH."""
    beside_python = Path(sys.executable).parent / name
    if beside_python.exists():
        return beside_python
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(
            f"{name} not found next to {sys.executable} or on PATH; "
            "install the 'servers' extra: pip install 'lorafleet[servers]'"
        )
    return Path(found)


def start_etcd(
    data_dir: Path, *, port: int | None = None, tls: TlsFiles | None = None
) -> LocalServer:
    """Start etcd with its data in ``data_dir`` and wait until ``/health`` says true.

    With ``tls`` clients must speak TLS and present a certificate the same CA signed.
    Health is read from a plain-HTTP metrics listener, which needs no certificate.
    """

    def start(client_port: int) -> LocalServer:
        (member,) = etcd_member_args(data_dir, [client_port], tls=tls)
        return _spawn("etcd", member.args, data_dir, member.url,
                      _etcd_healthy(member.health_url), health_url=member.health_url)  # fmt: skip

    return _on_port(start, port)


@dataclass(frozen=True)
class EtcdMemberArgs:
    """How to start one etcd member: its command line, client URL and health URL."""

    args: list[str]
    url: str
    health_url: str


def etcd_member_args(
    data_dir: Path, client_ports: list[int], *, tls: TlsFiles | None = None
) -> list[EtcdMemberArgs]:
    """Command lines for a cluster of ``len(client_ports)`` members (one: a lone etcd)."""
    scheme = "https" if tls else "http"
    names = [f"lorafleet{i}" if len(client_ports) > 1 else "lorafleet" for i in client_ports]
    peers = [f"http://127.0.0.1:{free_port()}" for _ in client_ports]
    cluster = ",".join(f"{n}={p}" for n, p in zip(names, peers, strict=True))
    members = []
    for name, peer, port in zip(names, peers, client_ports, strict=True):
        url, health = f"{scheme}://127.0.0.1:{port}", f"http://127.0.0.1:{free_port()}"
        args = [
            str(find_binary("etcd")), f"--name={name}", f"--data-dir={data_dir / name}",
            f"--listen-client-urls={url}", f"--advertise-client-urls={url}",
            f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster={cluster}", "--initial-cluster-token=lorafleet",
            f"--listen-metrics-urls={health}", "--log-level=warn", *_tls_args(tls),
        ]  # fmt: skip
        members.append(EtcdMemberArgs(args, url, health))
    return members


def _tls_args(tls: TlsFiles | None) -> list[str]:
    if tls is None:
        return []
    return [
        f"--cert-file={tls.server_cert}", f"--key-file={tls.server_key}",
        f"--trusted-ca-file={tls.ca_cert}", "--client-cert-auth",
    ]  # fmt: skip


def start_nats(
    data_dir: Path,
    *,
    port: int | None = None,
    jetstream: bool = False,
    config: Path | None = None,
    env: Mapping[str, str] | None = None,
    extra_args: Sequence[str] = (),
    name: str = "nats",
) -> LocalServer:
    """Start nats-server and wait until it accepts connections.

    ``config`` is a nats-server config file (e.g. ``deploy/nats/auth.conf``); ``env``
    holds the variables it reads. Flags (the port) win over the file.
    """

    def start(client_port: int) -> LocalServer:
        args = [str(find_binary("nats-server")), "-a", "127.0.0.1", "-p", str(client_port)]
        if config is not None:
            args += ["-c", str(config)]
        if jetstream:
            args += ["-js", "-sd", str(data_dir / "jetstream")]
        args += extra_args
        url = f"nats://127.0.0.1:{client_port}"
        return _spawn(name, args, data_dir, url, _nats_healthy(client_port), env=dict(env or {}))

    return _on_port(start, port)


def _on_port(start: Callable[[int], LocalServer], port: int | None) -> LocalServer:
    """Start on ``port``, or on a free port, trying another when a parallel run took it first.

    A port found free can be bound by another process before the server binds it, or become
    a connection's local port; the server then exits (and another may answer its health
    check in its place)."""
    if port is not None:
        return start(port)
    for _ in range(PORT_ATTEMPTS - 1):
        with contextlib.suppress(PortTakenError):
            return start(free_port())
    return start(free_port())


def start_nats_cluster(
    data_dir: Path,
    *,
    size: int = 3,
    config: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> list[LocalServer]:
    """Start ``size`` nats-servers routed into one cluster; returns when every route is up.

    Each member lists every other's route port; the client list for ``NATS_SERVER`` is
    ``",".join(s.url for s in servers)``.
    """
    cluster_ports = [free_port() for _ in range(size)]
    routes = ",".join(f"nats://127.0.0.1:{p}" for p in cluster_ports)
    servers: list[LocalServer] = []
    try:
        for index, cluster_port in enumerate(cluster_ports):
            name = f"nats-{index}"
            cluster_args = [
                "--name", name, "--cluster_name", "lorafleet", "--routes", routes,
                "--cluster", f"nats://127.0.0.1:{cluster_port}",
            ]  # fmt: skip
            servers.append(start_nats(data_dir / name, config=config, env=env,
                                      extra_args=cluster_args, name=name))  # fmt: skip
        _wait_for(lambda: all(nats_cluster_size(s.port) == size for s in servers), "NATS routes")
    except BaseException:
        for server in servers:
            server.stop(kill=True)
        raise
    return servers


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not ready after {START_TIMEOUT_S} s")
        time.sleep(_POLL_INTERVAL_S)


def nats_cluster_size(port: int) -> int:
    """How many servers the cluster advertises to clients of the server on ``port``."""
    with (
        contextlib.suppress(OSError, ValueError),
        socket.create_connection(("127.0.0.1", port), 1) as sock,
    ):
        line = sock.makefile("rb").readline()
        info = json.loads(line.removeprefix(b"INFO ").decode())
        return len(info.get("connect_urls") or [])
    return 0


def _spawn(
    name: str, args: list[str], data_dir: Path, url: str, healthy: Callable[[], bool],
    *, health_url: str = "", env: dict[str, str] | None = None,
) -> LocalServer:  # fmt: skip
    server = launch(name, args, data_dir, url, health_url=health_url, env=env)
    wait_healthy(server, healthy)
    return server


def launch(
    name: str,
    args: list[str],
    data_dir: Path,
    url: str,
    *,
    health_url: str = "",
    env: dict[str, str] | None = None,
) -> LocalServer:
    """Start a server process without waiting for it (cluster members wait for each other)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir / f"{name}.log"
    with log_path.open("ab") as log:
        log_start = log.tell()
        process = subprocess.Popen(
            die_with_parent(args), stdout=log, stderr=subprocess.STDOUT,  # gone with us
            stdin=subprocess.DEVNULL, start_new_session=True, env={**os.environ, **(env or {})},
        )  # fmt: skip
    port = int(url.rsplit(":", 1)[1])
    return LocalServer(name, url, port, data_dir, log_path, process, args, health_url, env or {},
                       log_start)  # fmt: skip


def wait_healthy(server: LocalServer, healthy: Callable[[], bool] | None = None) -> None:
    """Wait until ``server`` answers its health check; kill it and raise if it never does."""
    healthy = healthy or _health(server)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not (healthy() and _listens(server.process.pid, server.port)):
        if server.process.poll() is not None or time.monotonic() > deadline:
            server.stop(kill=True)
            error = PortTakenError if _port_taken(server) else RuntimeError
            raise error(f"{server.name} did not become healthy at {server.url}; "
                        f"see {server.log_path}")  # fmt: skip
        time.sleep(_POLL_INTERVAL_S)


class PortTakenError(RuntimeError):
    """Another process answers on the port a server was to listen on."""


def _port_taken(server: LocalServer) -> bool:
    """Whether another socket holds ``server``'s port: one listening there, or one its bind
    failed on (a connection's local port, drawn from the same range as ``free_port``'s)."""
    if _listening_sockets(server.port):
        return True
    with contextlib.suppress(OSError), server.log_path.open("rb") as log:
        log.seek(server.log_start)
        return b"address already in use" in log.read()
    return False


def _listening_sockets(port: int) -> set[str]:
    """The ``socket:[inode]`` names of the sockets listening on TCP ``port`` (Linux)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                if fields[1].endswith(f":{port:04X}") and fields[3] == "0A":  # 0A: LISTEN
                    inodes.add(f"socket:[{fields[9]}]")
    return inodes


def _listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds the listening socket of TCP ``port`` (without /proc: True)."""
    if not os.path.isdir("/proc/self/fd"):
        return True
    sockets = _listening_sockets(port)
    with contextlib.suppress(OSError):
        return any(
            os.readlink(f"/proc/{pid}/fd/{fd}") in sockets for fd in os.listdir(f"/proc/{pid}/fd")
        )
    return False


def _health(server: LocalServer) -> Callable[[], bool]:
    return _etcd_healthy(server.health_url) if server.health_url else _nats_healthy(server.port)


def _etcd_healthy(url: str) -> Callable[[], bool]:
    def check() -> bool:
        with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/health", timeout=1) as r:
            return b'"true"' in r.read()
        return False

    return check


def _nats_healthy(port: int) -> Callable[[], bool]:
    def check() -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1) as s:
            return s.recv(4).startswith(b"INFO")
        return False

    return check
