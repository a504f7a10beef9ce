"""``lorafleet up --secure``, etcd half: local certificates and a user, etcd with TLS and auth.

Everything is made fresh under ``<state dir>/secure/etcd/`` (``.lorafleet/`` is
git-ignored; never check these files in): a CA, server and client certificates, the
root and lorafleet passwords. The NATS half lives beside it, in a function of its own.
"""

from __future__ import annotations

import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from lorafleet.discovery.settings import EtcdSettings
from lorafleet.launch.etcd_auth import EtcdUser, enable_etcd_auth
from lorafleet.launch.local_servers import LocalServer, start_etcd
from lorafleet.launch.tls_files import TlsFiles, make_tls_files

__all__ = ["SecureEtcd", "start_secure_etcd"]

PASSWORD_BYTES: Final = 24


@dataclass(frozen=True)
class SecureEtcd:
    """A running etcd with TLS and auth, its files, and the settings its clients need."""

    server: LocalServer
    tls: TlsFiles
    settings: EtcdSettings
    root_password_path: Path

    def etcdctl_flags(self) -> str:
        """etcdctl's flags for this etcd as root (the password is read from its file)."""
        return (
            f"--endpoints {self.server.url} --cacert {self.tls.ca_cert} "
            f"--cert {self.tls.client_cert} --key {self.tls.client_key} "
            f"--user root:$(cat {self.root_password_path})"
        )


def start_secure_etcd(state_dir: Path, data_dir: Path, *, port: int) -> SecureEtcd:
    """Make certificates and passwords under ``state_dir/secure/etcd``, start etcd on ``port``."""
    secure_dir = state_dir / "secure" / "etcd"
    shutil.rmtree(secure_dir, ignore_errors=True)  # a fresh etcd gets fresh secrets
    secure_dir.mkdir(parents=True, mode=0o700)
    os.chmod(secure_dir.parent, 0o700)
    tls = make_tls_files(secure_dir / "tls")
    root_password = _password_file(secure_dir / "root.password")
    user = EtcdUser(password=_password_file(secure_dir / "lorafleet.password"))
    server = start_etcd(data_dir, port=port, tls=tls)
    try:
        enable_etcd_auth(server.url, root_password=root_password, user=user, tls=tls)
    except BaseException:
        server.stop()
        raise
    settings = EtcdSettings(
        endpoints=(server.url,), username=user.username, password=user.password,
        ca_path=tls.ca_cert, client_cert_path=tls.client_cert, client_key_path=tls.client_key,
    )  # fmt: skip
    return SecureEtcd(server, tls, settings, secure_dir / "root.password")


def _password_file(path: Path) -> str:
    password = secrets.token_urlsafe(PASSWORD_BYTES)
    path.touch(mode=0o600)
    path.write_text(password)
    return password
