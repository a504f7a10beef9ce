"""Turn on etcd authentication: a root user, and a lorafleet user whose role reaches only ``v1/``.

Used by the tests and ``lorafleet up --secure``; passwords go to etcdctl on stdin,
never on a command line that ``ps`` would show.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from lorafleet.discovery.keys import KEYS_ROOT
from lorafleet.launch.local_servers import find_binary

if TYPE_CHECKING:  # cryptography stays out of the etcd-auth image, which only runs etcdctl
    from lorafleet.launch.tls_files import TlsFiles

__all__ = ["EtcdUser", "auth_enabled", "enable_etcd_auth"]

_ETCDCTL_TIMEOUT_S: Final = 30


@dataclass(frozen=True, kw_only=True)
class EtcdUser:
    """An etcd user and the role of the same name that may read and write ``prefix``."""

    username: str = "lorafleet"
    password: str = field(repr=False)
    prefix: str = KEYS_ROOT


def enable_etcd_auth(
    endpoints: str, *, root_password: str, user: EtcdUser, tls: TlsFiles | None = None
) -> None:
    """Create root and ``user`` with its role, then enable auth (raises if etcdctl fails)."""
    _etcdctl(endpoints, tls, ["user", "add", "root", "--interactive=false"], root_password)
    _etcdctl(endpoints, tls, ["user", "grant-role", "root", "root"])
    _etcdctl(endpoints, tls, ["role", "add", user.username])
    grant = ["role", "grant-permission", user.username, "readwrite", user.prefix, "--prefix=true"]
    _etcdctl(endpoints, tls, grant)
    _etcdctl(endpoints, tls, ["user", "add", user.username, "--interactive=false"], user.password)
    _etcdctl(endpoints, tls, ["user", "grant-role", user.username, user.username])
    _etcdctl(endpoints, tls, ["auth", "enable"])


def auth_enabled(endpoints: str, *, root_password: str, tls: TlsFiles | None = None) -> bool:
    """Whether etcd already has authentication on; asked as root, who may ask either way."""
    root = {"ETCDCTL_USER": "root", "ETCDCTL_PASSWORD": root_password}  # not on a command line
    return "Authentication Status: true" in _etcdctl(endpoints, tls, ["auth", "status"], env=root)


def _etcdctl(
    endpoints: str,
    tls: TlsFiles | None,
    args: list[str],
    stdin: str = "",
    env: dict[str, str] | None = None,
) -> str:
    command = [str(find_binary("etcdctl")), f"--endpoints={endpoints}", *args]
    if tls is not None:
        command += [
            f"--cacert={tls.ca_cert}",
            f"--cert={tls.client_cert}",
            f"--key={tls.client_key}",
        ]
    done = subprocess.run(
        command,
        input=stdin + "\n",
        capture_output=True,
        text=True,
        timeout=_ETCDCTL_TIMEOUT_S,
        env={**os.environ, **(env or {})},
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"etcdctl {' '.join(args[:2])} at {endpoints} failed: {_last_line(done.stderr)}"
        )
    return done.stdout


def _last_line(stderr: str) -> str:
    """etcdctl's own error line; the client's JSON retry logs come before it."""
    lines = stderr.strip().splitlines()
    return lines[-1] if lines else "no output"
