"""The NATS half of ``lorafleet up --secure``: local passwords, NATS with authorization on.

Passwords are generated once per state directory into ``secure/nats.json`` (mode
0600, under the ignored ``.lorafleet/``; never checked in) and handed to nats-server,
which reads them into ``deploy/nats/auth.conf``, and to each process as
``NATS_AUTH_USERNAME``/``NATS_AUTH_PASSWORD`` of its role.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from lorafleet.discovery.keys import kv_events_subject
from lorafleet.launch.local_servers import LocalServer, start_nats

__all__ = [
    "NATS_AUTH_CONF",
    "NATS_ROLES",
    "NatsCredentials",
    "nats_credentials",
    "new_password",
    "start_secure_nats",
]

NATS_AUTH_CONF: Final = Path(__file__).resolve().parents[2] / "deploy" / "nats" / "auth.conf"
NATS_ROLES: Final = ("admin", "frontend", "worker")
"""The users of ``auth.conf``: each role's subject permissions are documented there."""
_PASSWORD_BYTES: Final = 32
_PASSWORD_PREFIX: Final = "lf"
"""Letters first, then hex: nats-server parses variables as config, and refuses some values
that start with '-' or a digit even in quotes (seen with ``token_urlsafe``)."""


@dataclass(frozen=True)
class NatsCredentials:
    """One password per role of ``auth.conf``."""

    passwords: dict[str, str] = field(repr=False)

    def server_env(self, namespace: str) -> dict[str, str]:
        """The variables nats-server reads into ``auth.conf``."""
        env = {
            f"LORAFLEET_NATS_{role.upper()}_PASSWORD": self.passwords[role] for role in NATS_ROLES
        }
        return {**env, "LORAFLEET_NATS_SUBJECTS": f"{namespace}.>",
                "LORAFLEET_NATS_KV_EVENTS": kv_events_subject(namespace)}  # fmt: skip

    def client_env(self, role: str) -> dict[str, str]:
        """The ``NATS_AUTH_*`` variables of a process in ``role``."""
        return {"NATS_AUTH_USERNAME": role, "NATS_AUTH_PASSWORD": self.passwords[role]}


def nats_credentials(state_dir: Path) -> NatsCredentials:
    """The passwords of ``state_dir``, generated the first time (readable by the owner only)."""
    path = state_dir / "secure" / "nats.json"
    if path.exists():
        return NatsCredentials(json.loads(path.read_text()))
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    passwords = {role: new_password() for role in NATS_ROLES}
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        json.dump(passwords, file)
    return NatsCredentials(passwords)


def new_password() -> str:
    """A fresh password that nats-server, Compose env files and shells all take as it is."""
    return _PASSWORD_PREFIX + secrets.token_hex(_PASSWORD_BYTES)


def start_secure_nats(
    data_dir: Path, credentials: NatsCredentials, *, namespace: str, port: int | None = None
) -> LocalServer:
    """Start nats-server with ``deploy/nats/auth.conf`` for ``namespace``'s subjects."""
    return start_nats(
        data_dir, port=port, config=NATS_AUTH_CONF, env=credentials.server_env(namespace)
    )
