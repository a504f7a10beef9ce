"""Build local stand-ins for the base images that the Dockerfile and compose.yaml name.

No container registry is reachable on CI machines, so the images are made from Debian:
the Python base from a debootstrap of bookworm (whose python3 is 3.11), etcd and NATS
from Debian's packages, each tagged with the exact name the project's files use. The
project's Dockerfile and compose.yaml stay exactly what a user runs.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Final

from compose_cli import REPO, resolved
from dockerd import DockerEngine

SUITE: Final = "bookworm"
DEFAULT_MIRROR: Final = "http://deb.debian.org/debian"
PYTHON_PACKAGES: Final = ("python3", "python3-pip", "python-is-python3", "ca-certificates")
HOST_CA_DIR: Final = Path("/usr/local/share/ca-certificates")
WHEELS_DIR: Final = "/opt/wheels"
# policy-rc.d: Debian's services must not try to start while their packages install.
SERVICE_DOCKERFILE: Final = """FROM {base}
RUN printf '#!/bin/sh\\nexit 101\\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d \\
 && apt-get update && apt-get install -y --no-install-recommends {packages} \\
 && rm -rf /var/lib/apt/lists/*
CMD ["{command}"]
"""
# compose service -> (Debian packages, the image's command)
SERVICE_PACKAGES: Final = {
    "etcd": ("etcd-server etcd-client", "etcd"),
    "nats": ("nats-server wget", "nats-server"),
}


def python_image() -> str:
    """Return the base image the Dockerfile names in `ARG PYTHON_IMAGE=...`."""
    text = (REPO / "Dockerfile").read_text()
    match = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.MULTILINE)
    if match is None:
        raise ValueError("Dockerfile has no `ARG PYTHON_IMAGE=<image>` line")
    return match.group(1)


def service_images() -> dict[str, str]:
    """Return the image compose.yaml names for each service that needs a stand-in."""
    services = resolved()["services"]
    return {name: services[name]["image"] for name in SERVICE_PACKAGES}


def build_standins(engine: DockerEngine, workdir: Path) -> None:
    """Build every stand-in image that the engine does not hold yet."""
    base = python_image()
    if not has_image(engine, base):
        build_python_image(engine, workdir, base)
    for service, image in service_images().items():
        if not has_image(engine, image):
            packages, command = SERVICE_PACKAGES[service]
            dockerfile = SERVICE_DOCKERFILE.format(base=base, packages=packages, command=command)
            build_from_text(engine, workdir / f"standin-{service}", dockerfile, image)


def has_image(engine: DockerEngine, image: str) -> bool:
    """Return whether the engine holds `image` locally."""
    return engine.run("image", "inspect", image, check=False).returncode == 0


def build_from_text(engine: DockerEngine, context: Path, dockerfile: str, image: str) -> None:
    """Build `dockerfile` (text) in an empty context folder and tag the result `image`."""
    context.mkdir(parents=True, exist_ok=True)
    (context / "Dockerfile").write_text(dockerfile)
    engine.run("build", "--tag", image, str(context))


def build_python_image(engine: DockerEngine, workdir: Path, image: str) -> None:
    """Debootstrap Debian with Python, make pip work as on this machine, import it as `image`."""
    rootfs = workdir / "rootfs"
    shutil.rmtree(rootfs, ignore_errors=True)
    include = f"--include={','.join(PYTHON_PACKAGES)}"
    command = ["debootstrap", "--variant=minbase", include, SUITE, str(rootfs), debian_mirror()]
    subprocess.run(command, check=True)  # its output shows in pytest's report on failure
    configure_pip(rootfs)
    in_chroot(rootfs, "apt-get", "clean")
    shutil.rmtree(rootfs / "var/lib/apt/lists", ignore_errors=True)
    tarball = workdir / "rootfs.tar"
    subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tarball), "."], check=True)
    changes = ["--change", "ENV LANG=C.UTF-8", "--change", 'CMD ["python3"]']
    engine.run("import", *changes, str(tarball), image)
    tarball.unlink()
    shutil.rmtree(rootfs)


def in_chroot(rootfs: Path, *command: str) -> None:
    """Run `command` inside `rootfs` with chroot."""
    subprocess.run(["chroot", str(rootfs), *command], check=True)


def configure_pip(rootfs: Path) -> None:
    """Give the image this machine's CA certificates and local wheels, and let pip install.

    The CA certificates let pip reach PyPI through this machine's proxy; the wheels
    (pip's local find-links, e.g. torch's CPU build) replace indexes that only this
    machine can reach; Debian's PEP 668 marker would refuse any `pip install`.
    """
    ca_dir = rootfs / HOST_CA_DIR.relative_to("/")
    for certificate in HOST_CA_DIR.glob("*.crt"):
        shutil.copy(certificate, ca_dir / certificate.name)
    in_chroot(rootfs, "update-ca-certificates")
    for marker in rootfs.glob("usr/lib/python3*/EXTERNALLY-MANAGED"):
        marker.unlink()
    wheels = rootfs / WHEELS_DIR.lstrip("/")
    wheels.mkdir(parents=True, exist_ok=True)
    for folder in local_find_links():
        for wheel in folder.glob("*.whl"):
            shutil.copy(wheel, wheels / wheel.name)
    pip_conf = "[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n"
    pip_conf += f"find-links = {WHEELS_DIR}\nroot-user-action = ignore\n"
    (rootfs / "etc/pip.conf").write_text(pip_conf)


def local_find_links() -> list[Path]:
    """Return the local folders that this machine's pip takes wheels from (find-links)."""
    command = [sys.executable, "-m", "pip", "config", "get", "global.find-links"]
    configured = subprocess.run(command, capture_output=True, text=True, check=False).stdout
    entries = f"{configured} {os.environ.get('PIP_FIND_LINKS', '')}".split()
    folders = {Path(entry.removeprefix("file://")) for entry in entries}
    return sorted(folder for folder in folders if folder.is_dir())


def debian_mirror() -> str:
    """Return the Debian mirror this machine's apt uses for the suite, or deb.debian.org."""
    for sources in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        for stanza in sources.read_text().split("\n\n"):
            fields = dict(re.findall(r"^(URIs|Suites):\s*(.+)$", stanza, re.MULTILINE))
            if SUITE in fields.get("Suites", "").split() and "URIs" in fields:
                return fields["URIs"].split()[0]
    legacy = Path("/etc/apt/sources.list")
    if legacy.exists():
        match = re.search(rf"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+{SUITE}\s", legacy.read_text(), re.M)
        if match:
            return match.group(1)
    return DEFAULT_MIRROR
