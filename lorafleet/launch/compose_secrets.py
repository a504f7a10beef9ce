"""``make secrets``: generate the passwords of ``compose.secure.yaml`` into a git-ignored env file.

The file is made once and then kept: etcd stores its users' passwords in its volume, so
new passwords would lock the stack out of its own etcd. Remove the file together with
the volumes (``docker compose ... down --volumes``) to start over. Nothing here is
ever checked in; ``.lorafleet/`` is in ``.gitignore``.

    python -m lorafleet.launch.compose_secrets                  # .lorafleet/compose-secrets.env
    docker compose -f compose.yaml -f compose.secure.yaml \\
        --env-file .lorafleet/compose-secrets.env up --build --wait
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Final

from lorafleet.launch.secure_nats import new_password

__all__ = ["COMPOSE_SECRETS", "DEFAULT_SECRETS_PATH", "write_compose_secrets"]

DEFAULT_SECRETS_PATH: Final = Path(".lorafleet") / "compose-secrets.env"
COMPOSE_SECRETS: Final = (
    "DYN_ADMIN_TOKEN",
    "DYN_SYSTEM_AUTH_TOKEN",
    "LORAFLEET_NATS_ADMIN_PASSWORD",
    "LORAFLEET_NATS_FRONTEND_PASSWORD",
    "LORAFLEET_NATS_WORKER_PASSWORD",
    "LORAFLEET_ETCD_ROOT_PASSWORD",
    "LORAFLEET_ETCD_PASSWORD",
)
"""Every variable compose.secure.yaml requires, each a fresh random value."""


def write_compose_secrets(path: Path = DEFAULT_SECRETS_PATH) -> bool:
    """Write a fresh value for each of ``COMPOSE_SECRETS`` to ``path`` (mode 0600).

    Returns False, and leaves the file alone, when ``path`` already exists.
    """
    if path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    lines = "".join(f"{name}={new_password()}\n" for name in COMPOSE_SECRETS)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(lines)
    return True


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_SECRETS_PATH
    made = write_compose_secrets(target)
    print(f"{'wrote' if made else 'kept the existing'} {target}")
